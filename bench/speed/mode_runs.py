"""What each mode of ``bench.speed.modes`` runs for one prompt, timed on the bench's own clock.

A mode is a function of one :class:`ModeCall` returning its run's fields: ``tokens``, ``seconds``, ``ttft_s`` (the
seconds to the first token, everything a user waits for included: encoding, prefill, the first step), the
acceptance, and whatever else it measures. The llama-server modes (bench.peer.modes) follow the same contract.
"""
from __future__ import annotations

import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from engine.cache.cached_chat import chat_scope
from engine.cache.embedder import load_default_embedder
from engine.cache.semantic_cache import SemanticCache
from engine.chat_engine import ChatEngine
from engine.surface import EngineSurface
from engine.config import CACHE_OFF, DEFAULT_SPEC, CacheConfig, SamplingConfig, SpecConfig
from engine.errors import NoPairError
from engine.events import CacheEvent, DoneEvent

PRIMER_TOKENS = 2


@dataclass(frozen=True)
class ModeCall:
    """One run of a mode: the request, and the state it starts from (``warm``: the mode's own state already holds
    the prompt, as a chat's next turn finds it; else the state a new request finds)."""
    engine: EngineSurface
    messages: list[dict]
    sampling: SamplingConfig
    spec: SpecConfig
    item: dict  # the prompt file's row: id, kind, prompt (a paraphrase for cache-verify, a history for related work)
    warm: bool = False

    def primer(self) -> ModeCall:
        """The untimed run that puts the prompt into the mode's state before a warm run: two new tokens, so its
        second step has room for a draft and the draft model sees the prompt too (with one, only the target would,
        and a speculative mode's warm first token would still pay the draft's prefill)."""
        return replace(self, sampling=replace(self.sampling, max_new_tokens=PRIMER_TOKENS))

    def history(self) -> ModeCall | None:
        """The untimed earlier request of a related item (its ``history``: a prompt whose answer the timed one's
        repeats, not in the timed prompt), run in full by the same mode first; None for other items."""
        if not self.item.get("history"):
            return None
        return replace(self, messages=[{"role": "user", "content": self.item["history"]}], warm=False)


@dataclass(frozen=True)
class Streamed:
    """A generation run to its end: its tokens, and when they came on the bench's clock."""
    seconds: float
    ttft_s: float | None  # None: no token came
    done: DoneEvent
    cache: CacheEvent | None  # the cache lookup's outcome, when the generation had one

    def fields(self) -> dict:
        acceptance = self.done.stats.acceptance
        return {"tokens": list(self.done.token_ids), "seconds": self.seconds, "ttft_s": self.ttft_s,
                "acceptance_rate": acceptance.acceptance_rate, "mean_accepted": acceptance.mean_accepted}


def timed_stream(start: Callable[[], Iterable]) -> Streamed:
    """Run the generation ``start()`` returns; the clock starts before the call, so the first TokenEvent's arrival
    (not its own ``t``, which starts inside the engine) is what a user waits for."""
    began = time.perf_counter()
    first = done = cache = None
    for event in start():
        if event.type == "token" and first is None:
            first = time.perf_counter() - began
        elif event.type == "done":
            done = event
        elif event.type == "cache":
            cache = event
    seconds = time.perf_counter() - began
    if done is None:
        raise RuntimeError("the generation ended without a DoneEvent")
    return Streamed(seconds, first, done, cache)


def decode_rate(new_tokens: int, seconds: float, ttft_s: float | None) -> float | None:
    """Tokens per second after the first token; None with fewer than two tokens or no first-token time."""
    if ttft_s is None or new_tokens < 2 or seconds <= ttft_s:
        return None
    return (new_tokens - 1) / (seconds - ttft_s)


def forget_prompts(engine: EngineSurface, memory: bool = True) -> None:
    """The state a new request finds: no pooled llama.cpp context holds a prompt (a torch runner starts empty
    anyway), so no mode resumes a prefill that another mode paid for, and (``memory``) no earlier answer is
    remembered."""
    if memory:
        engine.memory_clear()
    try:
        models = (engine.target, engine.draft)
    except NoPairError:
        models = ()
    for backend in {id(m.backend): m.backend for m in models}.values():  # a pair of one model has one pool
        getattr(backend, "forget_prompts", lambda: None)()


def run_target(call: ModeCall) -> dict:
    streamed = timed_stream(lambda: call.engine.generate_reference(call.messages, call.sampling))
    return {**streamed.fields(), "acceptance_rate": None, "mean_accepted": None}


def speculative_mode(make_spec: Callable[[SpecConfig], SpecConfig]) -> Callable[[ModeCall], dict]:
    """A bench mode running our loop with the spec derived from the CLI's (--k)."""
    def run(call: ModeCall) -> dict:
        spec = make_spec(call.spec)
        return timed_stream(lambda: call.engine.generate(call.messages, call.sampling, spec, cache=CACHE_OFF)).fields()
    return run


def predicted_text(item: dict) -> str:
    """What mode ``prediction`` sends as the predicted output: the item's own ``prediction``, else its prompt (an
    edit's prompt holds the file its answer restates; the proposer finds its place in it)."""
    return item.get("prediction") or item["prompt"]


def run_prediction(call: ModeCall) -> dict:
    """What the app does by default, with a client's prediction (``/v1``'s ``prediction``): a free draft."""
    prediction = predicted_text(call.item)
    streamed = timed_stream(lambda: call.engine.generate(call.messages, call.sampling, DEFAULT_SPEC, cache=CACHE_OFF,
                                                         prediction=prediction))
    predicted = streamed.done.stats.of_source("prediction")
    return {**streamed.fields(), "accepted_prediction_tokens": predicted.accepted,
            "rejected_prediction_tokens": predicted.proposed - predicted.accepted}


class FirstTokenClock:
    """transformers' streamer protocol (``put``, ``end``): generate puts the prompt first, then the new tokens as
    they come; the second put is the first token's arrival."""

    def __init__(self, began: float):
        self.began, self.puts, self.ttft_s = began, 0, None

    def put(self, token_ids) -> None:
        self.puts += 1
        if self.puts == 2:
            self.ttft_s = time.perf_counter() - self.began

    def end(self) -> None:
        pass


@torch.inference_mode()
def run_hf_assisted(call: ModeCall) -> dict:
    """transformers' own assisted generation on the same loaded models."""
    engine, clock = call.engine, FirstTokenClock(time.perf_counter())
    prompt = torch.tensor([engine.encode(call.messages)], device=engine.target.device)
    out = engine.target.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                       assistant_model=engine.draft.model, do_sample=False,
                                       max_new_tokens=call.sampling.max_new_tokens, streamer=clock,
                                       eos_token_id=sorted(engine.target.eos_ids), pad_token_id=0)
    seconds = time.perf_counter() - clock.began
    tokens = out[0, prompt.shape[1]:].tolist()
    for i, token in enumerate(tokens):
        if token in engine.target.eos_ids:
            tokens = tokens[:i]
            break
    return {"tokens": tokens, "seconds": seconds, "ttft_s": clock.ttft_s, "acceptance_rate": None,
            "mean_accepted": None}


def paraphrase(item: dict) -> str:
    """The item's own ``paraphrase``, or a light deterministic rewording of its prompt."""
    prompt = item["prompt"]
    return item.get("paraphrase") or f"Please {prompt[0].lower()}{prompt[1:]}"


def _timed_part(call: ModeCall, asked: list[dict], start: Callable[[], Iterable]) -> Streamed:
    """One of cache-verify's timed parts, from the state its run starts from: fresh, no pooled context holds a
    prompt; warm, the target's holds ``asked`` (its prefill done by an untimed target-only primer)."""
    forget_prompts(call.engine)
    if call.warm:
        timed_stream(lambda: call.engine.generate_reference(asked, call.primer().sampling))
    return timed_stream(start)


def run_cache_verify(call: ModeCall) -> dict:
    """Answer the prompt, then its paraphrase through the ``verified`` path (cached answer as the draft).

    Timed: the paraphrase only, against a target-only answer to the same paraphrase, each from the run's state."""
    engine, sampling = call.engine, call.sampling
    with tempfile.TemporaryDirectory() as tmp:
        cached = ChatEngine(cache=SemanticCache(tmp, load_default_embedder()))
        cached.use_models(engine.target, engine.draft)
        first = timed_stream(lambda: cached.generate(call.messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF))
        tokens = list(first.done.token_ids)
        # both answers stop at the same max_new_tokens, so the first one covers what the second needs
        cached.cache.store(call.item["prompt"], chat_scope(engine.target, sampling, call.messages),
                           engine.target.tokenizer.decode(tokens), tokens, complete=True)
        asked = [{"role": "user", "content": paraphrase(call.item)}]
        baseline = _timed_part(call, asked, lambda: engine.generate_reference(asked, sampling))
        verified = _timed_part(call, asked, lambda: cached.generate(asked, sampling, DEFAULT_SPEC,
                                                                    cache=CacheConfig(mode="verify")))
        cached.cache.close()
    base = baseline.fields()
    return {**verified.fields(), "cache_outcome": verified.cache.outcome, "similarity": verified.cache.similarity,
            "baseline_tokens_per_s": len(base["tokens"]) / base["seconds"],
            "baseline_decode_tokens_per_s": decode_rate(len(base["tokens"]), base["seconds"], base["ttft_s"]),
            "baseline_tokens": base["tokens"]}


MODES: dict[str, Callable[[ModeCall], dict]] = {
    "target": run_target,
    "spec": speculative_mode(lambda s: s),  # --proposer (default draft), --k; adaptive k only with --k auto
    "hf-assisted": run_hf_assisted,
    "lookup": speculative_mode(lambda s: replace(s, proposer="lookup", adaptive=False, k=max(s.k, 16))),
    "hybrid": speculative_mode(lambda s: replace(s, proposer="hybrid")),
    "adaptive": speculative_mode(lambda s: replace(s, proposer="fast-draft", adaptive=True)),
    "default": speculative_mode(lambda s: DEFAULT_SPEC),  # exactly what the app does by default
    "prediction": run_prediction,  # the default, with the item's prediction (else its prompt) as predicted output
    "cache-verify": run_cache_verify,
}
