"""The engine as the app sees it: a loaded draft/target pair and a ``generate`` that yields events.

Model forwards run one step at a time under one lock, which is never held while a caller runs (it is
released at every yield), so no call order can deadlock. Loading a new pair leaves the old one in place until
the new one has loaded and passed the pair check.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.cache import cached_chat
from engine.cache.judge import LLMJudge, judge_for
from engine.models.calibrate import calibrate
from engine.speed.costmodel import StepCosts
from engine.models.hardware import describe_choice, detect_machine
from engine.models.prompt import encode_chat
from engine.config import CACHE_OFF, CacheConfig, SamplingConfig, SpecConfig
from engine.divergence import Divergence, Fp32Proof, first_divergence
from engine.errors import NoPairError
from engine.events import Event, final_done
from engine.speed.kpolicy import policy_for
from engine.decode.runner import ModelRunner
from engine.models.loading import LoadedModel, check_pair, check_pair_sources, load_model, resolve_precision
from engine.proposers import PROPOSERS
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.decode.reference import reference_generate
from engine.cache.semantic_cache import SemanticCache
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.surface import CacheEntry, CacheInfo, CacheStats, PairInfo
from engine.lab.doctor import diagnose
from engine.lab.grid import DOCTOR_KINDS, ExperimentGrid
from engine.lab.results import DoctorReport, LabUpdate
from engine.lab.runner import ModelPool, run_grid


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
    forwards run one step at a time under ``self._lock``, released at every yield; swapping the pair never
    waits for a generation. The app calls only its ``engine.surface.EngineSurface`` methods."""

    def __init__(self, cache: SemanticCache | None = None, paraphrase_judge: bool = True,
                 cache_dir: Path | None = None):
        self.cache = cache
        self.cache_dir = cache_dir  # converted weights (engine/models/catalog.py); None: catalog.cache_root()
        self.paraphrase_judge = paraphrase_judge  # direct mode: the target judges near-hits (engine/cache/judge.py)
        self._judge_cache: tuple[LoadedModel, LLMJudge | None] | None = None
        self.pair: Pair | None = None
        self._lock = threading.Lock()  # one decoding step on the models at a time; never held across a yield
        self._load_lock = threading.Lock()  # one load at a time
        self._fp32: dict[str, LoadedModel] = {}  # fp32 copies for the "prove it" re-run, by model name

    # -- models -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load (or reuse) both models and check they can pair. On any error the previous pair stays.

        The tokenizers are compared first, so a mismatched pair is refused before any weights load.
        """
        target, draft = target.strip(), draft.strip()
        with self._load_lock:
            current = self.pair
            new_target = self._reusable(current and current.target, target, target_precision, "target")
            new_draft = self._reusable(current and current.draft, draft, draft_precision, "draft")
            if new_target is None or new_draft is None:
                check_pair_sources(target, draft, self.cache_dir)
            new_target = new_target or load_model(target, target_precision, role="target", cache_dir=self.cache_dir)
            new_draft = new_draft or load_model(draft, draft_precision, role="draft", cache_dir=self.cache_dir)
            self.use_models(new_target, new_draft)
        return self.info()

    @staticmethod
    def _reusable(current: LoadedModel | None, name: str, precision: str | None, role: str) -> LoadedModel | None:
        if current is not None and current.name == name and \
                resolve_precision(precision, current.device, role) == current.precision:
            return current
        return None

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

    def _judge(self, pair: Pair, cache_mode: str) -> LLMJudge | None:
        """In direct mode, the target itself judges whether a near-hit needs the same answer (only a target
        with a calibrated threshold; other targets keep the lexical guards alone)."""
        if cache_mode != "direct" or self.cache is None or not self.paraphrase_judge:
            return None
        cached = self._judge_cache
        if cached is None or cached[0] is not pair.target:  # one judge per target: it keeps its prompt's KV
            cached = self._judge_cache = (pair.target, judge_for(pair.target, self._lock))
        return cached[1]

    # -- generation ---------------------------------------------------------------------------------------
    def encode(self, messages: list[dict], pair: Pair | None = None) -> list[int]:
        target = (pair or self.require_pair()).target
        return encode_chat(target.tokenizer, messages, target.context_window)

    @staticmethod
    def _stream(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig) -> TokenStream:
        room = target.context_window - len(prompt_ids)
        return TokenStream(target.tokenizer, target.eos_ids, min(sampling.max_new_tokens, room),
                           sampling.stop_on_eos, prompt_tokens=len(prompt_ids))

    def _stepwise(self, events: Iterator[Event]) -> Iterator[Event]:
        """Compute each event under the lock, hand it over without it: a caller holding a paused generator
        can start another generation (or measure a baseline) in the same thread without a deadlock."""
        with closing(events):  # closing this generator (a cancelled request) closes the decoder too
            while True:
                with self._lock:
                    event = next(events, None)
                if event is None:
                    return
                yield event

    def generate(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig, *,
                 cache: CacheConfig = CacheConfig(), cancel: threading.Event | None = None) -> Iterator[Event]:
        """The assistant's answer to ``messages``: from the cache, or by speculative decoding.

        Yields a CacheEvent first, then TokenEvents and StatsEvents, and a DoneEvent (with the prompt's
        length in ``prompt_tokens``) last.
        """
        pair = self.require_pair()  # read once: a concurrent pair switch affects only later requests
        prompt_ids = self.encode(messages, pair)
        hit, cache_event, scope = cached_chat.lookup(self.cache, pair.target, messages, sampling, cache,
                                                     judge=self._judge(pair, cache.mode))
        yield cache_event
        stream = self._stream(pair.target, prompt_ids, sampling)
        if hit.outcome in ("exact", "cached"):
            yield from cached_chat.serve(hit, stream, self.cache)
            return
        proposer = PROPOSERS[spec.proposer](lambda: self._runner(pair.draft))  # only model drafts make one
        if hit.outcome == "verified":  # the cached answer becomes the draft; the target has the last word
            proposer = CachedAnswerProposer(list(hit.answer_token_ids), fallback=proposer)
        decoder = speculative_generate(self._runner(pair.target), proposer, prompt_ids, stream, sampling,
                                       k_policy=policy_for(spec, pair.costs), cancel=cancel)
        with closing(self._stepwise(decoder)) as events:
            for event in events:
                if event.type == "done":
                    cached_chat.remember(self.cache, scope, messages, event)
                yield event

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: the reference every speculative answer must match."""
        pair = self.require_pair()
        prompt_ids = self.encode(messages, pair)
        stream = self._stream(pair.target, prompt_ids, sampling)
        decoder = reference_generate(self._runner(pair.target), prompt_ids, stream, sampling, cancel)
        yield from self._stepwise(decoder)

    # -- divergences ----------------------------------------------------------------------------------------
    def explain_divergence(self, messages: list[dict], sampling: SamplingConfig, reference_ids: list[int],
                           other_ids: list[int]) -> Divergence | None:
        """Where ``other_ids`` first leaves the target-only ``reference_ids``, and the target's margin there."""
        pair = self.require_pair()
        prompt_ids = self.encode(messages, pair)
        with self._lock:
            return first_divergence(pair.target, prompt_ids, list(reference_ids), list(other_ids))

    def _fp32_copy(self, loaded: LoadedModel) -> LoadedModel:
        if loaded.precision == "fp32":
            return loaded
        if loaded.name not in self._fp32:
            self._fp32[loaded.name] = load_model(loaded.name, "fp32", device=loaded.device, cache_dir=self.cache_dir)
        return self._fp32[loaded.name]

    def prove_fp32(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig) -> Fp32Proof:
        """Target-only and speculative again with fp32 copies of the pair (loaded once, kept), cache off."""
        pair = self.require_pair()
        with self._load_lock:
            start = time.perf_counter()
            exact = ChatEngine()
            exact.use_models(self._fp32_copy(pair.target), self._fp32_copy(pair.draft))
            load_s = time.perf_counter() - start
        with self._lock:  # the fp32 engine has its own lock: hold ours so nothing else runs meanwhile
            start = time.perf_counter()
            reference = final_done(exact.generate_reference(messages, sampling)).token_ids
            other = final_done(exact.generate(messages, sampling, spec, cache=CACHE_OFF)).token_ids
            seconds = time.perf_counter() - start
            divergence = first_divergence(exact.target, exact.encode(messages), list(reference),
                                          list(other))
        return Fp32Proof(identical=reference == other, n_tokens=len(reference), divergence=divergence,
                         seconds=seconds, load_seconds=load_s, target=pair.target.name, draft=pair.draft.name)

    # -- experiments (engine/lab) ----------------------------------------------------------------------------
    def run_experiment(self, grid: ExperimentGrid, cancel: threading.Event | None = None) -> Iterator[LabUpdate]:
        """Run the grid; the loaded pair's models are reused, others load once for this run. Each step holds the
        engine's lock, like a generation: nothing else runs on the models in between."""
        pair = self.pair
        pool = ModelPool([pair.target, pair.draft] if pair else [], self.cache_dir)
        yield from self._stepwise(run_grid(grid, pool, cancel))

    def pair_doctor(self, kinds: tuple[str, ...] = DOCTOR_KINDS, probe_tokens: int = 24,
                    cancel: threading.Event | None = None) -> DoctorReport:
        """The loaded pair's checks, costs, break-even acceptance and predicted speedup per prompt kind."""
        pair = self.require_pair()
        with self._lock:
            return diagnose(pair.target, pair.draft, tuple(kinds), probe_tokens, cancel)

    # -- the semantic cache ---------------------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        if self.cache is None:
            return CacheInfo(available=False)
        return CacheInfo(available=True, threshold=self.cache.threshold, backend=self.cache.location)

    def cache_stats(self) -> CacheStats | None:
        if self.cache is None:
            return None
        s = self.cache.stats()
        return CacheStats(entries=s["entries"], lookups=s["lookups"], hits=s["hits"], misses=s["misses"],
                          hit_rate=s["hit_rate"], time_saved_s=s["time_saved_s"], warning=s.get("warning", ""))

    def cache_entries(self, limit: int = 50) -> list[CacheEntry]:
        if self.cache is None:
            return []
        return [CacheEntry(e["key"], e["prompt"], e["answer"], e["created"]) for e in self.cache.entries(limit)]

    def cache_delete(self, key: str) -> bool:
        return self.cache is not None and self.cache.delete(key)

    def cache_clear(self) -> None:
        if self.cache is not None:
            self.cache.clear()
