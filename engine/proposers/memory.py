"""Memory of earlier work: known text from every prompt and answer this instance has seen, as a free draft.

A request whose answer repeats an earlier answer (the same function asked for again with one more requirement, a
regenerated answer, a file restated in the next turn of another chat) has no draft in its own prompt: the earlier
answer is not there. ``AnswerMemory`` keeps the recent prompts and answers of one scope (bounded: ``max_tokens`` in
all, the oldest dropped first; ``clear`` forgets them), indexed by their ``KEY``-token n-grams, as vLLM's suffix
decoding keeps earlier outputs and llama.cpp's ``ngram-mod`` keeps a table across requests. ``MemoryProposer``
continues the longest match of the answer's latest tokens (at least ``KEY``, up to ``MAX_MATCH``), the most recent
where matches tie, and keeps following a text while the answer takes it whole, as the prediction proposer does.

Beside the semantic cache: the cache answers a prompt like an earlier one (and offers its answer as a draft when
it must be verified); the memory needs no similar prompt, only text the answer repeats, found as it goes.
Drafts are one-hot and the target decides every token, so no text crosses scopes; speed could, so the engine keeps
one memory per scope (a cache namespace, an API user) and per target (token ids are the tokenizer's).
"""
from __future__ import annotations

import threading
from collections import OrderedDict

import torch

from engine.config import SamplingConfig
from engine.decode.draft import EMPTY_DRAFT, Draft, Proposer
from engine.decode.step import StepBudget
from engine.proposers.prediction import following

KEY = 4  # tokens a match needs at least; the index's n-gram
MAX_MATCH = 16  # a longer match says no more: the evidence classes stop there
MAX_TOKENS = 32768  # tokens kept per memory (the index holds one entry per token)
CANDIDATES = 8  # the most recent occurrences of a key compared for the longest match


class AnswerMemory:
    """Recent token texts of one scope and the index of their ``KEY``-grams. Thread-safe: requests of one scope may
    read while another finishes and adds."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self._texts: OrderedDict[int, list[int]] = OrderedDict()  # text id -> tokens, oldest first
        self._index: dict[tuple[int, ...], list[tuple[int, int]]] = {}  # key -> [(text id, position after it)]
        self._seen: dict[int, int] = {}  # hash of a text's tokens -> its id: a text seen again is not kept twice
        self._next_id = 0
        self.tokens = 0  # tokens kept, at most max_tokens
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._texts)

    def add(self, tokens: list[int]) -> None:
        """Keep ``tokens`` (its last ``max_tokens``); drop the oldest texts beyond the bound."""
        tokens = list(tokens[-self.max_tokens:])
        if len(tokens) <= KEY:
            return
        digest = hash(tuple(tokens))
        with self._lock:
            if digest in self._seen:  # seen before: it becomes the most recent
                self._texts.move_to_end(self._seen[digest])
                return
            text_id, self._next_id = self._next_id, self._next_id + 1
            self._texts[text_id] = tokens
            self._seen[digest] = text_id
            for i in range(KEY, len(tokens)):
                self._index.setdefault(tuple(tokens[i - KEY:i]), []).append((text_id, i))
            self.tokens += len(tokens)
            while self.tokens > self.max_tokens:
                self._drop_oldest()

    def _drop_oldest(self) -> None:
        text_id, tokens = self._texts.popitem(last=False)
        self.tokens -= len(tokens)
        del self._seen[hash(tuple(tokens))]
        for i in range(KEY, len(tokens)):
            key = tuple(tokens[i - KEY:i])
            kept = [entry for entry in self._index.get(key, ()) if entry[0] != text_id]
            if kept:
                self._index[key] = kept
            else:
                self._index.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._texts.clear(), self._index.clear(), self._seen.clear()
            self.tokens = 0

    def match(self, context: list[int]) -> tuple[int, int, int] | None:
        """The longest match of ``context``'s latest tokens (``KEY`` to ``MAX_MATCH``; ties: the most recent) that
        leaves a token to propose: (text id, position after the match, its length); None: no match."""
        if len(context) < KEY:
            return None
        with self._lock:
            found = self._index.get(tuple(context[-KEY:]), ())[-CANDIDATES:]
            best = None
            for text_id, end in reversed(found):
                text = self._texts[text_id]
                if end >= len(text):
                    continue
                n = KEY
                while n < MAX_MATCH and n < end and n < len(context) and text[end - n - 1] == context[-n - 1]:
                    n += 1
                if best is None or n > best[2]:
                    best = (text_id, end, n)
            return best

    def text(self, text_id: int, start: int, n: int) -> list[int]:
        """``n`` tokens of a kept text from ``start`` ([] once the text is dropped)."""
        with self._lock:
            return list(self._texts.get(text_id, ())[start:start + n])


class Memories:
    """One AnswerMemory per (target, scope), made when first asked for."""

    def __init__(self, max_tokens: int = MAX_TOKENS):
        self.max_tokens = max_tokens
        self._memories: dict[tuple[str, str], AnswerMemory] = {}
        self._lock = threading.Lock()

    def get(self, target: str, scope: str = "") -> AnswerMemory:
        with self._lock:
            return self._memories.setdefault((target, scope), AnswerMemory(self.max_tokens))

    def clear(self) -> None:
        with self._lock:
            for memory in self._memories.values():
                memory.clear()


class MemoryProposer:
    name = "memory"

    def __init__(self, memory: AnswerMemory, fallback: Proposer):
        self.memory, self.fallback = memory, fallback
        self._last: tuple[int, int, int] | None = None  # (context length, text id, position) of the last span
        self._run = 0  # tokens the answer has agreed with that text on, up to the position

    def reset(self, prompt_ids: list[int], sampling: SamplingConfig, generator: torch.Generator) -> None:
        self._last = None
        self.fallback.reset(prompt_ids, sampling, generator)

    def behind(self, context_ids: list[int]) -> int:
        return self.fallback.behind(context_ids)

    def propose(self, context_ids: list[int], budget: StepBudget) -> Draft:
        """Up to the budget's span (free to make: the budget cuts it to what its evidence pays); with no span (no
        room this step) a place found is kept and nothing drafted, so the answer may be found following it."""
        place, evidence = self._following(context_ids)
        if place is None:
            found = self.memory.match(context_ids)
            place, evidence = (None, "") if found is None else (found[:2], f"match-{found[2]}")
            self._run = 0 if found is None else found[2]
        tokens = self.memory.text(*place, max(budget.span, 1)) if place else []
        if tokens and not budget.span:
            self._last = (len(context_ids), *place)
            return EMPTY_DRAFT
        if not tokens:
            self._last = None
            return self.fallback.propose(context_ids, budget)
        self._last = (len(context_ids), *place)
        return Draft(tokens, source=self.name, evidence=evidence)

    def _following(self, context_ids: list[int]) -> tuple[tuple[int, int] | None, str]:
        """Where the answer stands in the text it followed last: past that span's tokens the answer took, when it
        took all it has fed since (its own next token included), and whether it is "following" or "rejoined" it
        (engine/proposers/prediction.py ``following``)."""
        if self._last is None:
            return None, ""
        at, text_id, start = self._last
        new = context_ids[at:]
        if new and self.memory.text(text_id, start, len(new)) == new:
            self._run += len(new)
            return (text_id, start + len(new)), following(len(new), self._run)
        return None, ""
