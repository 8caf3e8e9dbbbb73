"""Cache-as-draft: propose the tokens of a cached answer to a similar prompt; the target verifies them.

While the answer so far matches the cached answer, the next chunk of it is proposed. After the target
corrects it, the proposer re-aligns by looking up the latest n-gram in the cached answer (an edit often
leaves the rest intact); with no match it falls back to another proposer (the draft model).
Drafts are one-hot (``q_probs=None``): the result is exactly what the target alone would produce.
"""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.decode.draft import Draft, Proposer
from engine.decode.step import StepBudget
from engine.proposers.ngram import ngram_match


class CachedAnswerProposer:
    name = "cached-answer"

    def __init__(self, answer_ids: list[int], fallback: Proposer):
        self.answer_ids = list(answer_ids)
        self.fallback = fallback
        self.prompt_len = 0

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.prompt_len = len(prompt_ids)
        self.fallback.reset(prompt_ids, sampling, generator)

    def behind(self, context_ids: list[int]) -> int:
        return self.fallback.behind(context_ids)

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        """Up to the budget's span (free to make: the budget cuts it to what its evidence pays)."""
        answer_so_far = context_ids[self.prompt_len:]
        n = len(answer_so_far)
        if answer_so_far == self.answer_ids[:n]:
            tokens, evidence = self.answer_ids[n:n + budget.span], "following"
        else:  # re-align: continue after the latest occurrence of our suffix inside the cached answer
            tokens, matched = ngram_match(context_ids, budget.span, source=self.answer_ids)
            evidence = f"match-{matched}"
        if not tokens:
            return self.fallback.propose(context_ids, budget)
        return Draft(tokens, source=self.name, evidence=evidence)
