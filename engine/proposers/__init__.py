"""Proposer registry: name -> factory. Siblings, not subclasses."""
from engine.config import PROPOSER_NAMES
from engine.decode.draft import EMPTY_DRAFT, Draft, Proposer
from engine.proposers.draft_model import DraftModelProposer
from engine.proposers.hybrid import HybridProposer
from engine.proposers.ngram import NgramProposer

# Drafting one more token pays while P(all drafted so far are right) beats the draft/target cost ratio,
# which is about 0.2-0.4 for a 3x smaller draft on CPU; below this the adaptive modes stop drafting early.
CONFIDENCE_CUTOFF = 0.25

# The draft model's output head keeps the most frequent token ids (lowest BPE ranks) plus the prompt's.
HEAD_TOKENS = 32768


def _draft_model(draft, adaptive: bool) -> DraftModelProposer:
    """Adaptive mode adds the confidence cut-off and the trimmed head; plain mode is the textbook draft."""
    if adaptive:
        return DraftModelProposer(draft, min_confidence=CONFIDENCE_CUTOFF, head_tokens=HEAD_TOKENS)
    return DraftModelProposer(draft)


PROPOSERS = {  # factory(draft runner, adaptive) -> proposer
    "draft": _draft_model,
    "lookup": lambda draft, adaptive: NgramProposer(),
    # in the hybrid a lookup replaces the draft model, so it needs a longer (more specific) match
    "hybrid": lambda draft, adaptive: HybridProposer(NgramProposer(max_ngram=5, min_ngram=3),
                                                     _draft_model(draft, adaptive)),
}

assert tuple(PROPOSERS) == PROPOSER_NAMES, "engine/config.py PROPOSER_NAMES must list the registry keys"

__all__ = ["Draft", "EMPTY_DRAFT", "Proposer", "PROPOSERS", "DraftModelProposer", "NgramProposer",
           "HybridProposer", "CONFIDENCE_CUTOFF"]
