"""Draft-model proposer: a small model of the same family runs k cheap autoregressive steps."""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.decode.runner import ModelRunner
from engine.decode.draft import EMPTY_DRAFT, Draft
from engine.decode.sampling import logits_to_probs, sample


class DraftModelProposer:
    name = "draft"

    def __init__(self, draft: ModelRunner, min_confidence: float = 0.0, head_tokens: int | None = None):
        self.draft = draft
        self.min_confidence = min_confidence  # stop drafting once P(all drafted tokens right) looks lower
        # Trim the draft's output head to the ``head_tokens`` lowest ids (BPE ranks: the most frequent
        # merges) plus every prompt token. The head is ~30% of a 0.5B model's per-token work; a token
        # outside it is simply never drafted, and the target still decides every token.
        self.head_tokens = head_tokens
        self.sampling = SamplingConfig()
        self.generator: torch.Generator | None = None

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.sampling, self.generator = sampling, generator
        if self.head_tokens is not None and self.head_tokens < self.draft.vocab_size:
            self.draft.trim_head([*range(self.head_tokens), *prompt_ids])

    def propose(self, context_ids: list[int], k: int) -> Draft:
        if k <= 0:
            return EMPTY_DRAFT
        self.draft.rollback(self.draft.reusable_prefix(context_ids))  # keep what is still valid
        feed = context_ids[len(self.draft.tokens):]
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
        return Draft(tokens, torch.stack(q_rows))  # q: (len(tokens), vocab)
