"""Prompt-lookup proposer: continue the longest n-gram that already occurred in the prompt or the answer.

Costs no model call, and its drafts are one-hot (``q_probs=None``). It pays most on edits and rewrites,
where the answer copies long spans of the prompt.
"""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.decode.draft import EMPTY_DRAFT, Draft


def ngram_lookup(context: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2,
                 source: list[int] | None = None) -> list[int]:
    """Up to ``k`` tokens that followed the latest occurrence of the longest matching suffix n-gram of
    ``context``, searched in ``source`` (default: earlier in ``context`` itself)."""
    own = source is None
    source = context if own else source
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        pattern = context[-n:]
        first = pattern[0]
        last_start = len(source) - n - 1 if own else len(source) - n
        for start in range(last_start, -1, -1):  # most recent occurrence first
            if source[start] == first and source[start:start + n] == pattern:
                found = source[start + n:start + n + k]
                if found:
                    return found
    return []


class NgramProposer:
    name = "lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Stateless: the context is the whole memory."""

    def propose(self, context_ids: list[int], k: int) -> Draft:
        tokens = ngram_lookup(context_ids, k, self.max_ngram, self.min_ngram)
        return Draft(tokens) if tokens else EMPTY_DRAFT
