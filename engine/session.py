"""The engine as the app sees it: a loaded draft/target pair and a ``generate`` that yields events.

One generation runs at a time (a lock); loading a new pair leaves the old one in place until the new one
has loaded and passed the pair check.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from engine.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.cache import cached_chat
from engine.calibrate import calibrate
from engine.costmodel import StepCosts
from engine.hardware import describe_choice, detect_machine
from engine.prompt import encode_chat
from engine.config import SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError, NoPairError
from engine.events import Event
from engine.kpolicy import AdaptiveK, FixedK, KPolicy
from engine.runner import ModelRunner
from engine.models import LoadedModel, check_pair, load_model, resolve_precision
from engine.proposers import PROPOSERS
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.reference import reference_generate
from engine.cache.semantic_cache import SemanticCache
from engine.speculative import speculative_generate
from engine.stream import TokenStream


def k_policy(spec: SpecConfig, prior: StepCosts | None = None) -> KPolicy:
    """The policy for ``spec``; ``prior`` (the pair's calibration) starts its cost model."""
    if spec.adaptive:
        return AdaptiveK(k_init=min(max(spec.k, spec.k_min), spec.k_max), k_min=spec.k_min, k_max=spec.k_max,
                         prior=prior)
    return FixedK(spec.k, prior=prior)


@dataclass(frozen=True)
class PairInfo:
    target: str
    draft: str
    target_precision: str
    draft_precision: str
    device: str
    precision_note: str = ""  # why these precisions, e.g. "AVX2 CPU (...) -> target int8-dynamic (auto), ..."
    costs: StepCosts | None = None  # the step costs measured at load


@dataclass(frozen=True)
class Pair:
    """The loaded models as one value: swapped in one assignment, read once per request."""
    target: LoadedModel
    draft: LoadedModel
    costs: StepCosts  # calibrated at load: the adaptive k starts from it
    precision_note: str  # what auto chose (or the user) on this machine

    def info(self) -> PairInfo:
        return PairInfo(self.target.name, self.draft.name, self.target.precision, self.draft.precision,
                        str(self.target.device), self.precision_note, self.costs)


class ChatEngine:
    """Safe to share between threads: a request reads ``self.pair`` once and uses only that value; model
    forwards run one at a time under ``self._lock``; swapping the pair never waits for a generation."""

    def __init__(self, cache: SemanticCache | None = None):
        self.cache = cache
        self.pair: Pair | None = None
        self._lock = threading.Lock()  # one generation on the models at a time
        self._load_lock = threading.Lock()  # one load at a time

    # -- models -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load (or reuse) both models and check they can pair. On any error the previous pair stays."""
        with self._load_lock:
            current = self.pair
            new_target = self._reuse_or_load(current and current.target, target, target_precision, "target")
            new_draft = self._reuse_or_load(current and current.draft, draft, draft_precision, "draft")
            self.use_models(new_target, new_draft)
        return self.info()

    @staticmethod
    def _reuse_or_load(current: LoadedModel | None, name: str, precision: str | None, role: str) -> LoadedModel:
        if current is not None and current.name == name.strip() and \
                resolve_precision(precision, current.device, role) == current.precision:
            return current
        return load_model(name.strip(), precision, role=role)

    def use_models(self, target: LoadedModel, draft: LoadedModel) -> None:
        """Install already-loaded models (tests, benchmarks): one assignment, after the pair check and a
        short calibration of their forward costs."""
        check_pair(target, draft)
        costs = calibrate(self._runner(target), self._runner(draft))  # own KV caches: safe beside a generation
        note = describe_choice(detect_machine(target.device.type), target.precision, draft.precision,
                               (target.auto_precision, draft.auto_precision))
        self.pair = Pair(target, draft, costs, note)

    def require_pair(self) -> Pair:
        pair = self.pair
        if pair is None:
            raise NoPairError("no models loaded yet: load a target and a draft first")
        return pair

    @property
    def target(self) -> LoadedModel:
        return self.require_pair().target

    @property
    def draft(self) -> LoadedModel:
        return self.require_pair().draft

    def info(self) -> PairInfo:
        return self.require_pair().info()

    @staticmethod
    def _runner(loaded: LoadedModel) -> ModelRunner:
        """A fresh KV cache per generation: the same prompt and seed always give the same answer."""
        return ModelRunner(loaded.model, loaded.vocab_size)

    # -- generation ---------------------------------------------------------------------------------------
    def encode(self, messages: list[dict], sampling: SamplingConfig, pair: Pair | None = None) -> list[int]:
        target = (pair or self.require_pair()).target
        return encode_chat(target.tokenizer, messages, target.context_window, sampling.max_new_tokens)

    @staticmethod
    def _stream(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig) -> TokenStream:
        room = target.context_window - len(prompt_ids)
        return TokenStream(target.tokenizer, target.eos_ids, min(sampling.max_new_tokens, room),
                           sampling.stop_on_eos)

    def generate(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig,
                 cancel: threading.Event | None = None, cache_mode: str = "verify",
                 cache_threshold: float | None = None) -> Iterator[Event]:
        """The assistant's answer to ``messages``: from the cache, or by speculative decoding.

        Yields a CacheEvent first, then TokenEvents and StatsEvents, and a DoneEvent last.
        """
        pair = self.require_pair()  # read once: a concurrent pair switch affects only later requests
        prompt_ids = self.encode(messages, sampling, pair)
        if spec.proposer not in PROPOSERS:
            raise InvalidSettingError(f"unknown proposer {spec.proposer!r}; choose one of {', '.join(PROPOSERS)}")
        if cache_mode not in cached_chat.CACHE_MODES:
            raise InvalidSettingError(f"cache mode must be one of {', '.join(cached_chat.CACHE_MODES)}")
        hit, cache_event = cached_chat.lookup(self.cache, pair.target, messages, sampling, cache_mode,
                                              cache_threshold)
        yield cache_event
        stream = self._stream(pair.target, prompt_ids, sampling)
        if hit.outcome in ("exact", "cached"):
            yield from cached_chat.serve(hit, stream, self.cache)
            return
        with self._lock:
            proposer = PROPOSERS[spec.proposer](self._runner(pair.draft), spec.adaptive)
            if hit.outcome == "verified":  # the cached answer becomes the draft; the target has the last word
                proposer = CachedAnswerProposer(list(hit.answer_token_ids), fallback=proposer)
            for event in speculative_generate(self._runner(pair.target), proposer, prompt_ids, stream, sampling,
                                              k_policy(spec, pair.costs), cancel):
                if event.type == "done":
                    cached_chat.remember(self.cache, pair.target, messages, sampling, event)
                yield event

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: the reference every speculative answer must match."""
        pair = self.require_pair()
        prompt_ids = self.encode(messages, sampling, pair)
        with self._lock:
            yield from reference_generate(self._runner(pair.target), prompt_ids,
                                          self._stream(pair.target, prompt_ids, sampling), sampling, cancel)
