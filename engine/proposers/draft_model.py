"""Draft-model proposer: a small model of the same family runs k cheap autoregressive steps.

Its runner's cache holds the context it last drafted from plus the drafted tokens it fed (all but the last).
Within a generation each context extends the previous one (the loop only appends), so what stays valid is
found by comparing those few drafted tokens with the new context: O(k), never a scan of the context.
"""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.backends.contract import Runner, common_prefix
from engine.decode.draft import EMPTY_DRAFT, Draft
from engine.decode.step import StepBudget
from engine.decode.sampling import logits_to_probs, sample


class DraftModelProposer:
    """``name`` labels its stats and traces: the registry entry that made it (``draft``, ``fast-draft``)."""

    def __init__(self, draft: Runner, min_confidence: float = 0.0, head_tokens: int | None = None,
                 name: str = "draft"):
        self.draft = draft
        self.name = name
        self.min_confidence = min_confidence  # stop drafting once P(all drafted tokens right) looks lower
        # Trim the draft's output head to the ``head_tokens`` lowest ids (BPE ranks: the most frequent
        # merges) plus every prompt token. The head is ~30% of a 0.5B model's per-token work; a token
        # outside it is simply never drafted, and the target still decides every token.
        self.head_tokens = head_tokens
        self.sampling = SamplingConfig()
        self.generator: torch.Generator | None = None
        self._drafted_from = 0  # the runner's first tokens that every later context starts with
        self._fed: list[int] = []  # the drafted tokens the runner consumed after those

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.sampling, self.generator = sampling, generator
        self._drafted_from, self._fed = self.draft.resume(prompt_ids), []  # a reused runner: once per generation
        if self.head_tokens is not None and self.head_tokens < self.draft.vocab_size:
            self.draft.trim_head([*range(self.head_tokens), *prompt_ids])

    def _kept(self, context_ids: list[int]) -> int:
        """What the runner holds of ``context_ids`` (never the whole: the last token is fed again, its logits
        predict the next one)."""
        start = self._drafted_from
        kept = start + common_prefix(self._fed, context_ids[start:start + len(self._fed)])  # what the target kept
        return min(kept, len(context_ids) - 1, len(self.draft.tokens))

    def behind(self, context_ids: list[int]) -> int:
        return max(0, len(context_ids) - 1 - self._kept(context_ids))

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        k = budget.k
        if k <= 0:
            return EMPTY_DRAFT
        self.draft.rollback(self._kept(context_ids))  # one rollback
        feed = context_ids[len(self.draft.tokens):]
        first = len(feed)  # its catch-up and the step's newest token; then one drafted token a forward
        tokens, q_rows, confidence = [], [], 1.0
        for _ in range(k):
            q = logits_to_probs(self.draft.forward(feed, n_logits=1)[-1], self.sampling)  # (vocab,)
            token = sample(q, self.sampling, self.generator)
            tokens.append(token)
            q_rows.append(q)
            confidence *= float(q[token])
            if confidence < self.min_confidence:
                break
            feed = [token]
        self._drafted_from, self._fed = len(context_ids), tokens[:-1]  # the last one was never fed
        return Draft(tokens, torch.stack(q_rows), self.name, fed=first + len(tokens) - 1)  # q: (len(tokens), vocab)
