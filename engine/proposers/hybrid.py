"""Hybrid proposer: a prompt-lookup draft when the text so far repeats, the draft model otherwise."""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.decode.draft import Draft
from engine.decode.step import StepBudget
from engine.proposers.draft_model import DraftModelProposer
from engine.proposers.ngram import NgramProposer


class HybridProposer:
    name = "hybrid"

    def __init__(self, lookup: NgramProposer, model: DraftModelProposer):
        self.lookup, self.model = lookup, model

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.lookup.reset(prompt_ids, sampling, generator)
        self.model.reset(prompt_ids, sampling, generator)

    def behind(self, context_ids: list[int]) -> int:
        return self.model.behind(context_ids)

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        draft = self.lookup.propose(context_ids, budget)  # free to make: up to the budget's span, longer than k
        return draft if len(draft) else self.model.propose(context_ids, budget)
