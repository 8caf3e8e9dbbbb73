"""Prompt-lookup proposer: continue the longest n-gram that already occurred in the prompt or the answer.

Costs no model call, and its drafts are one-hot (``q_probs=None``). It pays most on edits and rewrites,
where the answer copies long spans of the prompt. Its evidence (``Draft.evidence``) is the match's length: a suffix
of FOLLOWING_MATCH tokens or more found again says the answer is copying that text, as a prediction or a memory the
answer took whole does, and is priced as "following" (engine/decode/free_drafts.py ``FreeDrafts``); shorter matches
("match-<n>") each learn their own acceptance, which on code is often low (indentation and ``self.`` repeat with
other continuations).
"""
from __future__ import annotations

import torch

from engine.config import SamplingConfig
from engine.decode.draft import EMPTY_DRAFT, Draft
from engine.decode.step import StepBudget

FOLLOWING_MATCH = 8  # a suffix match this long: the answer is copying the text it matched


def ngram_match(context: list[int], k: int, max_ngram: int = 4, min_ngram: int = 2,
                source: list[int] | None = None) -> tuple[list[int], int]:
    """Up to ``k`` tokens that followed the latest occurrence of the longest matching suffix n-gram of
    ``context`` (``min_ngram <= n <= max_ngram``, ``n < len(context)``), searched in ``source`` (default:
    earlier in ``context`` itself). Only occurrences followed by at least one token count.

    One pass, as vLLM's n-gram proposer: KMP over ``source`` reversed, with the reversed suffix as the
    pattern. Scanning the reversed text meets the latest occurrences first, so the first position where the
    match reaches a new length is the latest occurrence of that length: O(len(source) + max_ngram).
    """
    source = context if source is None else source
    m = min(max_ngram, len(context) - 1)  # the suffix n-gram is never the whole context
    if k <= 0 or m < max(min_ngram, 1):
        return [], 0
    pattern = context[:-m - 1:-1]  # the last m tokens, reversed: pattern[j] = context[-1 - j]
    text = source[-2::-1]  # source without its last token, reversed: a match must leave a token to propose
    fail = _failure(pattern)
    best_len, best_end, state, i = 0, -1, 0, 0
    while i < len(text):
        if state == 0:  # skip to the next token that can start a match (list.index runs in C)
            try:
                i = text.index(pattern[0], i)
            except ValueError:
                break
        token = text[i]
        while state and token != pattern[state]:
            state = fail[state - 1]
        if token == pattern[state]:
            state += 1
            if state > best_len:  # strictly longer: ties keep the earlier position, the latest occurrence
                best_len, best_end = state, i
                if state == m:  # the longest possible n-gram at its latest occurrence
                    break
        i += 1
    if best_len < min_ngram:
        return [], 0
    start = len(source) - 2 - best_end + best_len  # the occurrence's first token is text[best_end]
    return source[start:start + k], best_len


def _failure(pattern: list[int]) -> list[int]:
    """KMP failure function: fail[j] = length of the longest proper prefix of pattern[:j + 1] that is also
    its suffix."""
    fail = [0] * len(pattern)
    state = 0
    for j in range(1, len(pattern)):
        while state and pattern[j] != pattern[state]:
            state = fail[state - 1]
        if pattern[j] == pattern[state]:
            state += 1
        fail[j] = state
    return fail


class NgramProposer:
    name = "lookup"

    def __init__(self, max_ngram: int = FOLLOWING_MATCH, min_ngram: int = 2):
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        """Stateless: the context is the whole memory."""

    def behind(self, context_ids: list[int]) -> int:
        return 0

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        tokens, n = ngram_match(context_ids, budget.span, self.max_ngram, self.min_ngram)
        if not tokens:
            return EMPTY_DRAFT
        return Draft(tokens, source=self.name, evidence="following" if n >= FOLLOWING_MATCH else f"match-{n}")
