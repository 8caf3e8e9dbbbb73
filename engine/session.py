"""The engine as the app sees it: a loaded draft/target pair and a ``generate`` that yields events.

One generation runs at a time (a lock); loading a new pair leaves the old one in place until the new one
has loaded and passed the pair check.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from engine.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine import cached_chat
from engine.chat import encode_chat
from engine.config import SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.events import Event
from engine.kpolicy import AdaptiveK, FixedK, KPolicy
from engine.kv import CachedModel
from engine.models import LoadedModel, check_pair, load_model
from engine.proposers import PROPOSERS
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.reference import reference_generate
from engine.semantic_cache import SemanticCache
from engine.speculative import speculative_generate
from engine.stream import TokenStream


def k_policy(spec: SpecConfig) -> KPolicy:
    if spec.adaptive:
        return AdaptiveK(k_init=min(max(spec.k, spec.k_min), spec.k_max), k_min=spec.k_min, k_max=spec.k_max)
    return FixedK(spec.k)


@dataclass(frozen=True)
class PairInfo:
    target: str
    draft: str
    target_precision: str
    draft_precision: str
    device: str


class ChatEngine:
    def __init__(self, cache: SemanticCache | None = None):
        self.cache = cache
        self.target: LoadedModel | None = None
        self.draft: LoadedModel | None = None
        self._lock = threading.Lock()

    # -- models -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load (or reuse) both models and check they can pair. On any error the previous pair stays."""
        new_target = self._reuse_or_load(self.target, target, target_precision, "target")
        new_draft = self._reuse_or_load(self.draft, draft, draft_precision, "draft")
        check_pair(new_target, new_draft)
        with self._lock:
            self.target, self.draft = new_target, new_draft
        return self.info()

    @staticmethod
    def _reuse_or_load(current: LoadedModel | None, name: str, precision: str | None, role: str) -> LoadedModel:
        if current is not None and current.name == name.strip() and precision in (None, current.precision):
            return current
        return load_model(name.strip(), precision, role=role)

    def use_models(self, target: LoadedModel, draft: LoadedModel) -> None:
        """Install already-loaded models (tests, benchmarks)."""
        check_pair(target, draft)
        self.target, self.draft = target, draft

    def info(self) -> PairInfo:
        self._require_pair()
        return PairInfo(self.target.name, self.draft.name, self.target.precision, self.draft.precision,
                        str(self.target.device))

    def _require_pair(self) -> None:
        if self.target is None or self.draft is None:
            raise InvalidSettingError("no models loaded yet: load a target and a draft first")

    @staticmethod
    def _runner(loaded: LoadedModel) -> CachedModel:
        """A fresh KV cache per generation: the same prompt and seed always give the same answer."""
        return CachedModel(loaded.model, loaded.vocab_size)

    # -- generation ---------------------------------------------------------------------------------------
    def encode(self, messages: list[dict], sampling: SamplingConfig) -> list[int]:
        self._require_pair()
        return encode_chat(self.target.tokenizer, messages, self.target.context_window, sampling.max_new_tokens)

    def _stream(self, prompt_ids: list[int], sampling: SamplingConfig) -> TokenStream:
        room = self.target.context_window - len(prompt_ids)
        return TokenStream(self.target.tokenizer, self.target.eos_ids, min(sampling.max_new_tokens, room),
                           sampling.stop_on_eos)

    def generate(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig,
                 cancel: threading.Event | None = None, cache_mode: str = "verify",
                 cache_threshold: float | None = None) -> Iterator[Event]:
        """The assistant's answer to ``messages``: from the cache, or by speculative decoding.

        Yields a CacheEvent first, then TokenEvents and StatsEvents, and a DoneEvent last.
        """
        prompt_ids = self.encode(messages, sampling)
        if spec.proposer not in PROPOSERS:
            raise InvalidSettingError(f"unknown proposer {spec.proposer!r}; choose one of {', '.join(PROPOSERS)}")
        if cache_mode not in cached_chat.CACHE_MODES:
            raise InvalidSettingError(f"cache mode must be one of {', '.join(cached_chat.CACHE_MODES)}")
        hit, cache_event = cached_chat.lookup(self.cache, self.target, messages, sampling, cache_mode,
                                              cache_threshold)
        yield cache_event
        stream = self._stream(prompt_ids, sampling)
        if hit.outcome in ("exact", "cached"):
            yield from cached_chat.serve(hit, stream, self.cache)
            return
        with self._lock:
            proposer = PROPOSERS[spec.proposer](self._runner(self.draft), spec.adaptive)
            if hit.outcome == "verified":  # the cached answer becomes the draft; the target has the last word
                proposer = CachedAnswerProposer(list(hit.answer_token_ids), fallback=proposer)
            for event in speculative_generate(self._runner(self.target), proposer, prompt_ids, stream, sampling,
                                              k_policy(spec), cancel):
                if event.type == "done":
                    cached_chat.remember(self.cache, self.target, messages, sampling, event)
                yield event

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: the reference every speculative answer must match."""
        prompt_ids = self.encode(messages, sampling)
        with self._lock:
            yield from reference_generate(self._runner(self.target), prompt_ids, self._stream(prompt_ids, sampling),
                                          sampling, cancel)
