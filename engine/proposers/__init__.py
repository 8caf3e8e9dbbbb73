"""Proposer registry: name -> factory. Siblings, not subclasses. Each entry's proposer carries the entry's name
(its ``name`` labels the stats and traces).

A factory gets ``make_draft``, which loads nothing itself: it makes the draft model's runner (which may hold
tokens: the proposer resumes from them) when called, and only the entries that draft with the model call it.
Which draft each entry uses:

- ``draft``: the draft model as in the papers, k tokens with the full output head;
- ``fast-draft``: the draft model with the confidence cut-off and the trimmed output head;
- ``lookup``: prompt lookup (n-grams of the prompt and the answer), no draft model;
- ``hybrid``: prompt lookup when the text repeats, the fast draft otherwise (the app's default).
"""
from collections.abc import Callable

from engine.config import FREE_PROPOSERS, PROPOSER_NAMES
from engine.decode.draft import EMPTY_DRAFT, Draft, Proposer
from engine.backends.contract import Runner
from engine.proposers.draft_model import DraftModelProposer
from engine.proposers.hybrid import HybridProposer
from engine.proposers.ngram import NgramProposer

# Drafting one more token pays while P(all drafted so far are right) beats the draft/target cost ratio; the
# cut-off sits at the low end of that ratio for a draft a few times smaller than its target, and below it the fast
# draft stops drafting early.
CONFIDENCE_CUTOFF = 0.25

# The fast draft's output head keeps the most frequent token ids (lowest BPE ranks) plus the prompt's.
HEAD_TOKENS = 32768

DraftRunnerMaker = Callable[[], Runner]  # makes the draft model's runner; called only by model drafts
ProposerFactory = Callable[[DraftRunnerMaker], Proposer]


def textbook_draft(make_draft: DraftRunnerMaker) -> DraftModelProposer:
    """The draft model drafts k tokens with its full output head."""
    return DraftModelProposer(make_draft(), name="draft")


def fast_draft(make_draft: DraftRunnerMaker) -> DraftModelProposer:
    """The draft model stops early below CONFIDENCE_CUTOFF and computes logits only for HEAD_TOKENS ids plus
    the prompt's."""
    return DraftModelProposer(make_draft(), min_confidence=CONFIDENCE_CUTOFF, head_tokens=HEAD_TOKENS,
                              name="fast-draft")


def prompt_lookup(make_draft: DraftRunnerMaker) -> NgramProposer:
    """No draft model: ``make_draft`` is never called."""
    return NgramProposer()


def hybrid(make_draft: DraftRunnerMaker) -> HybridProposer:
    """Prompt lookup, else the fast draft. Here a lookup replaces the draft model, so it needs a longer (more
    specific) match than the plain lookup."""
    return HybridProposer(NgramProposer(min_ngram=3), fast_draft(make_draft))


PROPOSERS: dict[str, ProposerFactory] = {
    "draft": textbook_draft,
    "fast-draft": fast_draft,
    "lookup": prompt_lookup,
    "hybrid": hybrid,
}


class _NoDraftModel(Exception):
    pass


def _builds_without_a_draft_model(factory: ProposerFactory) -> bool:
    """Whether ``factory`` makes its proposer without calling ``make_draft`` (cheap: the others call it first)."""
    def refuse():
        raise _NoDraftModel
    try:
        factory(refuse)
    except _NoDraftModel:
        return False
    return True


assert tuple(PROPOSERS) == PROPOSER_NAMES, "engine/config.py PROPOSER_NAMES must list the registry keys"
assert {name for name, factory in PROPOSERS.items() if _builds_without_a_draft_model(factory)} == FREE_PROPOSERS, \
    "engine/config.py FREE_PROPOSERS must list the entries that need no draft model"

__all__ = ["Draft", "EMPTY_DRAFT", "Proposer", "PROPOSERS", "ProposerFactory", "DraftRunnerMaker",
           "DraftModelProposer", "NgramProposer", "HybridProposer", "CONFIDENCE_CUTOFF", "HEAD_TOKENS"]
