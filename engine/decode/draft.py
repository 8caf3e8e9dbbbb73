"""The proposer interface. A proposer guesses the next tokens; the target decides (engine/decode/verify.py).

Siblings, not subclasses: draft model, n-gram lookup, cached answer, hybrid. Each is a small class with
``reset`` and ``propose``; the loop in engine/decode/speculative.py only sees this protocol. How much to draft
is the k policy's business (a ``StepBudget``, engine/decode/step.py), not the proposer's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.config import SamplingConfig
from engine.decode.step import StepBudget


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    q_probs: torch.Tensor | None = None  # (len(tokens), vocab) draft distributions; None = one-hot draft
    source: str = ""  # who drafted it (a proposer's name; a composite proposer's draft names its part)
    # why known text is drafted, for pricing (engine/decode/free_drafts.py FreeDrafts learns each source's and each
    # evidence class's record): "following" (the answer took the source's last span whole and goes on with it),
    # "rejoined" (the last span was cut to nothing and the target's token is the source's), "start" (a prediction's
    # first span), "match-<n>" (found again after an n-token match); "" for a model's draft
    evidence: str = ""
    fed: int = 0  # tokens a draft model's forwards took to make it: its catch-up, then its drafted tokens but the last

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def free(self) -> bool:
        """A one-hot draft (no draft distributions: a prompt lookup, a cached answer): it cost no draft forward to
        make, though each token still widens the verify forward. An empty draft is no draft, so not free."""
        return bool(self.tokens) and self.q_probs is None

    def truncate(self, n: int) -> Draft:
        if len(self.tokens) <= n:
            return self
        return Draft(self.tokens[:n], self.q_probs[:n] if self.q_probs is not None else None, self.source,
                     self.evidence, self.fed)

    def before(self, markers: frozenset[int]) -> Draft:
        """A free draft up to its first token in ``markers`` (the tokenizer's special tokens: the chat template's
        turn markers, the end of an answer); a model's draft as it is. Known text is the text of a prompt or an
        answer: a lookup that runs on past a prompt's end would draft ``<|im_end|>``, the next turn's header and
        the answer's own start, which the answer never repeats there (a 45-wide verify that took 1 token)."""
        if not self.free or not markers:
            return self
        return self.truncate(next((i for i, t in enumerate(self.tokens) if t in markers), len(self.tokens)))

    @property
    def evidence_class(self) -> str:
        """What the k policy prices a free draft by: its source and its evidence."""
        return f"{self.source}/{self.evidence}"


EMPTY_DRAFT = Draft(tokens=[])


class Proposer(Protocol):
    name: str

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Start a new generation for this prompt."""

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        """Tokens that may follow ``context_ids`` (prompt + everything emitted so far): a draft model's up to
        ``budget.k``, known text's up to ``budget.span``. Within one generation each call's context extends the
        previous call's: the loop only appends."""

    def behind(self, context_ids: list[int]) -> int:
        """Tokens a draft model would feed before its first drafted token beyond the one every step feeds (its
        catch-up: the prompt it has not seen, the target's tokens since it last drafted); 0 without a draft model."""
