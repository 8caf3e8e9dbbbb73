"""The engine as the app sees it: a loaded draft/target pair and a ``generate`` that yields events.

One generation runs at a time (a lock); loading a new pair leaves the old one in place until the new one
has loaded and passed the pair check.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass

from engine.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.chat import encode_chat
from engine.config import SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.events import Event
from engine.kpolicy import FixedK
from engine.kv import CachedModel
from engine.models import LoadedModel, check_pair, load_model
from engine.proposers import PROPOSERS
from engine.reference import reference_generate
from engine.speculative import speculative_generate
from engine.stream import TokenStream


@dataclass(frozen=True)
class PairInfo:
    target: str
    draft: str
    target_precision: str
    draft_precision: str
    device: str


class ChatEngine:
    def __init__(self):
        self.target: LoadedModel | None = None
        self.draft: LoadedModel | None = None
        self._lock = threading.Lock()

    # -- models -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load (or reuse) both models and check they can pair. On any error the previous pair stays."""
        new_target = self._reuse_or_load(self.target, target, target_precision)
        new_draft = self._reuse_or_load(self.draft, draft, draft_precision)
        check_pair(new_target, new_draft)
        with self._lock:
            self.target, self.draft = new_target, new_draft
        return self.info()

    @staticmethod
    def _reuse_or_load(current: LoadedModel | None, name: str, precision: str | None) -> LoadedModel:
        if current is not None and current.name == name.strip() and precision in (None, current.precision):
            return current
        return load_model(name.strip(), precision)

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
                 cancel: threading.Event | None = None) -> Iterator[Event]:
        """Speculative decoding of the assistant's answer to ``messages``."""
        prompt_ids = self.encode(messages, sampling)
        if spec.proposer not in PROPOSERS:
            raise InvalidSettingError(f"unknown proposer {spec.proposer!r}; choose one of {', '.join(PROPOSERS)}")
        with self._lock:
            proposer = PROPOSERS[spec.proposer](self._runner(self.draft))
            yield from speculative_generate(self._runner(self.target), proposer, prompt_ids,
                                            self._stream(prompt_ids, sampling), sampling, FixedK(spec.k), cancel)

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: the reference every speculative answer must match."""
        prompt_ids = self.encode(messages, sampling)
        with self._lock:
            yield from reference_generate(self._runner(self.target), prompt_ids, self._stream(prompt_ids, sampling),
                                          sampling, cancel)
