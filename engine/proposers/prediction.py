"""Predicted outputs (OpenAI's ``prediction``): text the client expects the answer to restate, as a free draft.

A prediction is not the answer. An edit's answer restates the file around its changes, with words of its own
before, between and after. So the proposer keeps its place in the prediction, as a reader keeps a finger on a
line: while the answer follows the prediction, the next span after the place is proposed; once the target departs
from it, the place is found again by the answer's latest n-gram (its first occurrence at or after the last place,
else the first anywhere), and until the answer rejoins the prediction the fallback proposer drafts.

Drafts are one-hot (``q_probs=None``) and the target decides every token, so the answer is exactly the target's;
a wrong prediction costs only the width of the verify forwards that carried it, which the k policy prices.
"""
from __future__ import annotations

import torch

from engine.backends.contract import common_prefix
from engine.config import SamplingConfig
from engine.decode.draft import Draft, Proposer
from engine.decode.step import StepBudget
from engine.proposers.ngram import FOLLOWING_MATCH


def find_match(context: list[int], prediction: list[int], anchor: int, min_ngram: int = 3,
               max_ngram: int = 8) -> tuple[int, int] | None:
    """Where in ``prediction`` the text continues after ``context``: just past an occurrence of the longest
    suffix n-gram of ``context`` (``min_ngram <= n <= max_ngram``) that leaves a token to propose, the first one at
    or after ``anchor`` (the last known place), else the first one; and n. None: no such n-gram occurs."""
    for n in range(min(max_ngram, len(context)), min_ngram - 1, -1):
        suffix = context[-n:]
        starts = _occurrences(prediction, suffix)
        ends = [i + n for i in starts if i + n < len(prediction)]
        if ends:
            return next((end for end in ends if end >= anchor), ends[0]), n
    return None


def _occurrences(text: list[int], pattern: list[int]) -> list[int]:
    """Every start of ``pattern`` in ``text``, in order (list.index finds each candidate first token in C)."""
    found, i, first = [], 0, pattern[0]
    while True:
        try:
            i = text.index(first, i)
        except ValueError:
            return found
        if text[i:i + len(pattern)] == pattern:
            found.append(i)
        i += 1


def following(new: int, run: int) -> str:
    """The evidence of an answer that took all ``new`` tokens fed since a known text's last span, ``run`` tokens of
    agreement in all: "following" where it took a span whole (its own next token with it) or has agreed on
    FOLLOWING_MATCH tokens (as a lookup's match that long says); "rejoined" where that span was cut to nothing and
    only the target's one token agrees: weaker, and priced apart (engine/decode/free_drafts.py)."""
    return "following" if new > 1 or run >= FOLLOWING_MATCH else "rejoined"


class PredictionProposer:
    name = "prediction"

    def __init__(self, prediction_ids: list[int], fallback: Proposer):
        self.prediction = list(prediction_ids)
        self.fallback = fallback
        self.prompt_len = 0
        self.anchor = 0  # the last place the answer was known to follow the prediction
        self._last: tuple[int, int] | None = None  # (context length, place) of the span proposed last
        self._run = 0  # tokens the answer has agreed with the prediction on, up to the place

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self.prompt_len, self.anchor, self._last, self._run = len(prompt_ids), 0, None, 0
        self.fallback.reset(prompt_ids, sampling, generator)

    def behind(self, context_ids: list[int]) -> int:
        return self.fallback.behind(context_ids)

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        """Up to the budget's span (free to make: the budget cuts it to what its evidence pays); with no span (no
        room this step) the place is kept and nothing drafted, so the answer may be found following it next step."""
        place, evidence = self._place(context_ids)
        if place is None or place >= len(self.prediction):
            self._last = None
            return self.fallback.propose(context_ids, budget)
        self.anchor, self._last = place, (len(context_ids), place)
        return Draft(self.prediction[place:place + budget.span], source=self.name, evidence=evidence)

    def _place(self, context_ids: list[int]) -> tuple[int | None, str]:
        """Where the answer stands in the prediction, and the evidence: past the last span when the target took all
        of it and its own next token is the prediction's too ("following"; ``following`` says when it is only
        "rejoined"); at the start before the answer's first token ("start"); else found again by an n-token match
        ("match-<n>")."""
        if self._last is not None:
            at, place = self._last
            new = context_ids[at:]
            if common_prefix(new, self.prediction[place:place + len(new)]) == len(new):
                self._run += len(new)
                return place + len(new), following(len(new), self._run)
        elif len(context_ids) == self.prompt_len:
            return 0, "start"
        found = find_match(context_ids[self.prompt_len:], self.prediction, self.anchor)
        self._run = 0 if found is None else found[1]
        return (None, "") if found is None else (found[0], f"match-{found[1]}")
