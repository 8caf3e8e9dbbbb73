"""Generation with the semantic cache in front, as plain functions over (pair, cache, lock).

A request reads its pair once (a concurrent switch affects only later requests) and runs the model one step at
a time under the model lock. The cache steps (lookup, serve, remember, forget a refuted entry) are
engine/cache/cached_chat.py's; what needs the target (the exact-hit check) is here.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace

from engine.cache import cached_chat
from engine.cache.semantic_cache import CacheHit, SemanticCache
from engine.config import CacheConfig, SamplingConfig, SpecConfig
from engine.divergence import first_disagreement
from engine.events import Event
from engine.models.prompt import encode_chat, encode_prediction
from engine.proposers.memory import Memories
from engine.serve.model_lock import ModelLock
from engine.serve.pair_slot import NO_JUDGE, Judging, Pair
from engine.start.decoders import start_reference, start_speculative, token_stream


MEMORY_PROMPT_TOKENS = 2048  # of a prompt, the tail the memory keeps (a long chat's history is in earlier entries)


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict]
    sampling: SamplingConfig
    spec: SpecConfig
    cache: CacheConfig = CacheConfig()
    cancel: threading.Event | None = None
    prediction: str = ""  # the text the answer is expected to restate (OpenAI's predicted outputs): a free draft
    memory_scope: str = ""  # whose earlier prompts and answers draft this one (engine/proposers/memory.py)


def encode(pair: Pair, messages: list[dict]) -> list[int]:
    return encode_chat(pair.target.tokenizer, messages, pair.target.context_window)


def answer(pair: Pair, cache: SemanticCache | None, lock: ModelLock, request: ChatRequest,
           judging: Judging = NO_JUDGE, memories: Memories | None = None) -> Iterator[Event]:
    """The assistant's answer: from the cache, or by speculative decoding. A CacheEvent first, then TokenEvents
    and StatsEvents, and a DoneEvent (with the prompt's length in ``prompt_tokens``) last. ``memories``: the
    instance's memory of earlier work; this request's scope drafts from it, and its prompt and answer join it."""
    prompt_ids = encode(pair, request.messages)
    prediction = encode_prediction(pair.target.tokenizer, request.prediction, pair.target.context_window)
    hit, cache_event, scope = cached_chat.lookup(cache, pair.target, request.messages, request.sampling,
                                                 request.cache, judge=judging.judge, judge_note=judging.note)
    stream = token_stream(pair.target, prompt_ids, request.sampling)
    if hit.needs_check:  # verify mode, or a store not trusted: served only if the target would say it
        hit = check_hit(pair, lock, prompt_ids, hit, request.sampling, stream.max_new_tokens)
        cache_event = hit.to_event()
    yield cache_event
    if hit.outcome in ("exact", "cached"):
        yield from cached_chat.serve(hit, stream, cache)
        return
    cached_answer = tuple(hit.answer_token_ids) if hit.outcome == "verified" else ()  # the draft; the target decides
    # greedy requests only: a seeded sampled answer is reproducible when its drafts are (rejection sampling draws
    # from the generator as its drafts go), and a memory changes with every answer
    memory = memories.get(pair.target.name, request.memory_scope) if memories is not None else None
    drafting_memory = memory if request.sampling.greedy else None
    decode = start_speculative(pair.target, pair.draft, prompt_ids, request.sampling, request.spec, costs=pair.costs,
                               cached_answer=cached_answer, prediction=tuple(prediction), stream=stream,
                               cancel=request.cancel, width_cap=pair.verify.width_cap,
                               measuring=pair.checks is None, memory=drafting_memory)
    for event in lock.stepwise(decode, pair.models, "while generating"):
        if event.type == "done":
            if memory is not None:
                memory.add(prompt_ids[-MEMORY_PROMPT_TOKENS:] + list(event.token_ids))
            stored = cached_chat.remember(cache, scope, request.messages, event)
            if hit.refuted and not stored:  # the entry is wrong, and nothing complete replaced it
                cached_chat.forget(cache, hit)
        yield event


def check_hit(pair: Pair, lock: ModelLock, prompt_ids: list[int], hit: CacheHit, sampling: SamplingConfig,
              limit: int) -> CacheHit:
    """An exact hit the target must check: one forward over the cached answer, as far as this request's ``limit``
    of new tokens serves it (:func:`engine.divergence.first_disagreement`). Served as ``exact`` when the target
    would give every token (rounding ties aside); otherwise it becomes the draft of a ``verified`` answer that
    replaces it. A sampled answer is always drawn again, the cached one its draft."""
    at, answer_ids = None, list(hit.answer_token_ids)
    if sampling.greedy:
        at = lock.run([pair.target], "while checking a cached answer",
                      lambda: first_disagreement(pair.target, prompt_ids, answer_ids[:limit],
                                                 ends=len(answer_ids) < limit))
        if at is None:
            return replace(hit, needs_check=False, reason="")
        why = f"the target disagrees with the cached answer at token {at + 1}; its own answer replaces it"
    else:
        why = "a sampled answer: the target draws its own, with the cached one as its draft"
    return replace(hit, outcome="verified", reason=why, refuted=at is not None)


def reference(pair: Pair, lock: ModelLock, messages: list[dict], sampling: SamplingConfig,
              cancel: threading.Event | None = None) -> Iterator[Event]:
    """Target-only decoding: the reference every speculative answer must match, its prompt computed as a fresh
    prefill computes it wherever the identity check found a width cap (as in the ``identical`` verify mode)."""
    decode = start_reference(pair.target, encode(pair, messages), sampling, cancel=cancel, width_cap=pair.verify.cap)
    return lock.stepwise(decode, pair.models, "while generating")
