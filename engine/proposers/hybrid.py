"""Hybrid proposer: a prompt-lookup draft when the text so far repeats, the draft model otherwise."""
from __future__ import annotations

import torch

from engine.config import FREE_SPAN, SamplingConfig
from engine.decode.draft import Draft
from engine.proposers.draft_model import DraftModelProposer
from engine.proposers.ngram import NgramProposer


class HybridProposer:
    name = "hybrid"

    def __init__(self, lookup: NgramProposer, model: DraftModelProposer, lookup_span: int = FREE_SPAN):
        self.lookup, self.model = lookup, model
        self.lookup_span = lookup_span  # lookup drafts are free to make, so they may be longer than k

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.lookup.reset(prompt_ids, sampling, generator)
        self.model.reset(prompt_ids, sampling, generator)

    def propose(self, context_ids: list[int], k: int) -> Draft:
        draft = self.lookup.propose(context_ids, max(k, self.lookup_span))
        return draft if len(draft) else self.model.propose(context_ids, k)
