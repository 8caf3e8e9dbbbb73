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
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.cache import cached_chat
from engine.cache.judge import LLMJudge, judge_for, uncalibrated_note
from engine.models.calibrate import calibrate
from engine.speed.costmodel import StepCosts
from engine.models.devices import check_target_precision, gpu_bytes, is_out_of_memory, out_of_memory, release_memory
from engine.models.hardware import describe_choice, detect_machine
from engine.models.prompt import encode_chat
from engine.config import AUTO, CACHE_OFF, CacheConfig, SamplingConfig, SpecConfig
from engine.divergence import Divergence, Fp32Proof, batch_invariant, first_disagreement, first_divergence
from engine.errors import NoPairError
from engine.events import CacheEvent, Event, final_done
from engine.speed.kpolicy import policy_for
from engine.decode.runner import ModelRunner
from engine.models.loading import LoadedModel, check_pair, check_pair_sources, load_model, plan_precisions
from engine.proposers import PROPOSERS
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.decode.reference import reference_generate
from engine.cache.semantic_cache import CacheHit, SemanticCache
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.surface import CacheEntry, CacheInfo, CacheStats, PairInfo
from engine.lab.doctor import diagnose
from engine.lab.grid import DOCTOR_KINDS, ExperimentGrid
from engine.lab.results import DoctorReport, LabUpdate
from engine.lab.experiment import ModelPool, run_grid


@dataclass(frozen=True)
class Pair:
    """The loaded models as one value: swapped in one assignment, read once per request."""
    target: LoadedModel
    draft: LoadedModel
    costs: StepCosts  # calibrated at load: the adaptive k starts from it
    precision_note: str  # what auto chose (or the user) on this machine

    def info(self) -> PairInfo:
        return PairInfo(self.target.name, self.draft.name, self.target.precision, self.draft.precision,
                        str(self.target.device), self.precision_note, self.costs,
                        bit_identical=batch_invariant(self.target))


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
        self._fp32: dict[str, LoadedModel] = {}  # fp32 copies (on the CPU) for "prove it", by name; this pair's only

    # -- models -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load (or reuse) both models and check they can pair. On any error the previous pair stays.

        The precisions are decided for the pair together (``auto`` on a GPU weighs both sizes against its free
        memory) and refused when the device cannot run them; then the tokenizers are compared, so a mismatched
        pair is refused before any weights load.
        """
        target, draft = target.strip(), draft.strip()
        with self._load_lock:
            current = self.pair
            plan = plan_precisions({"target": (target, target_precision), "draft": (draft, draft_precision)},
                                   cache_dir=self.cache_dir,  # what a switch reuses or frees counts as free
                                   reclaimable_bytes=gpu_bytes([current.target, current.draft] if current else []))
            check_target_precision(plan.precisions["target"])
            new_target = self._reusable(current and current.target, target, plan.precisions["target"])
            new_draft = self._reusable(current and current.draft, draft, plan.precisions["draft"])
            if new_target is None or new_draft is None:
                check_pair_sources(target, draft, self.cache_dir)
            new_target = new_target or self._load(target, target_precision, plan.precisions["target"], "target")
            new_draft = new_draft or self._load(draft, draft_precision, plan.precisions["draft"], "draft")
            self.use_models(new_target, new_draft, reason=plan.reason)
        return self.info()

    def _load(self, name: str, asked: str | None, precision: str, role: str) -> LoadedModel:
        loaded = load_model(name, precision, role=role, cache_dir=self.cache_dir)
        loaded.auto_precision = asked in (None, AUTO)  # the plan resolved auto: say so in the note
        return loaded

    @staticmethod
    def _reusable(current: LoadedModel | None, name: str, precision: str) -> LoadedModel | None:
        return current if current is not None and (current.name, current.precision) == (name, precision) else None

    def use_models(self, target: LoadedModel, draft: LoadedModel, reason: str = "") -> None:
        """Install already-loaded models (tests, benchmarks): one assignment, after the pair check and a
        short calibration of their forward costs. ``reason`` says why auto chose these precisions. What only
        the previous pair used (its judge, its fp32 copies) is let go, and the device's memory with it."""
        check_pair(target, draft)
        costs = calibrate(self._runner(target), self._runner(draft))  # own KV caches: safe beside a generation
        note = describe_choice(detect_machine(target.device.type), target.precision, draft.precision,
                               (target.auto_precision, draft.auto_precision), reason)
        switched = self.pair is not None
        self.pair = Pair(target, draft, costs, note)
        if switched:
            self._let_go_of_the_old_pair()

    def _let_go_of_the_old_pair(self) -> None:
        pair = self.pair
        judge = self._judge_cache
        if judge is not None and judge[0] is not pair.target:  # the judge holds its target (and a KV cache)
            self._judge_cache = None
        self._fp32 = {name: m for name, m in self._fp32.items() if name in (pair.target.name, pair.draft.name)}
        release_memory(pair.target.device)

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

    def _judge(self, pair: Pair, cache_mode: str) -> tuple[LLMJudge | None, str]:
        """(judge, note). In direct mode the target itself judges whether a near-hit needs the same answer,
        only at a (model, precision) with a calibrated threshold; otherwise the lexical guards stay alone, the
        hits the judge would have decided are verified, and ``note`` says so."""
        if cache_mode != "direct" or self.cache is None or not self.paraphrase_judge:
            return None, ""
        cached = self._judge_cache
        if cached is None or cached[0] is not pair.target:  # one judge per target: it keeps its prompt's KV
            cached = self._judge_cache = (pair.target, judge_for(pair.target, self._lock))
        return cached[1], "" if cached[1] is not None else uncalibrated_note(pair.target)

    # -- generation ---------------------------------------------------------------------------------------
    def encode(self, messages: list[dict], pair: Pair | None = None) -> list[int]:
        target = (pair or self.require_pair()).target
        return encode_chat(target.tokenizer, messages, target.context_window)

    @staticmethod
    def _stream(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig) -> TokenStream:
        room = target.context_window - len(prompt_ids)
        return TokenStream(target.tokenizer, target.eos_ids, min(sampling.max_new_tokens, room),
                           sampling.stop_on_eos, prompt_tokens=len(prompt_ids))

    def _stepwise(self, events: Iterator[Event], pair: Pair | None) -> Iterator[Event]:
        """Compute each event under the lock, hand it over without it: a caller holding a paused generator
        can start another generation (or measure a baseline) in the same thread without a deadlock. A GPU
        out of memory becomes a DeviceOutOfMemoryError that says what the models take."""
        with closing(events):  # closing this generator (a cancelled request) closes the decoder too
            while True:
                with self._lock:
                    try:
                        event = next(events, None)
                    except RuntimeError as err:
                        if is_out_of_memory(err) and pair is not None:  # what the models take, what to do
                            raise out_of_memory("while generating", [pair.target, pair.draft]) from err
                        raise
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
        judge, note = self._judge(pair, cache.mode)
        hit, cache_event, scope = cached_chat.lookup(self.cache, pair.target, messages, sampling, cache,
                                                     judge=judge, judge_note=note)
        stream = self._stream(pair.target, prompt_ids, sampling)
        if hit.needs_check:  # verify mode, or a store not trusted: served only if the target would say it
            hit, cache_event = self._check(pair, prompt_ids, hit, sampling, stream.max_new_tokens)
        yield cache_event
        if hit.outcome in ("exact", "cached"):
            yield from cached_chat.serve(hit, stream, self.cache)
            return
        proposer = PROPOSERS[spec.proposer](lambda: self._runner(pair.draft))  # only model drafts make one
        if hit.outcome == "verified":  # the cached answer becomes the draft; the target has the last word
            proposer = CachedAnswerProposer(list(hit.answer_token_ids), fallback=proposer)
        decoder = speculative_generate(self._runner(pair.target), proposer, prompt_ids, stream, sampling,
                                       k_policy=policy_for(spec, pair.costs), cancel=cancel)
        with closing(self._stepwise(decoder, pair)) as events:
            for event in events:
                if event.type == "done" and not cached_chat.remember(self.cache, scope, messages, event) \
                        and hit.refuted:
                    self.cache.delete(hit.entry_key)  # wrong, and nothing complete to replace it with
                yield event

    def _check(self, pair: Pair, prompt_ids: list[int], hit: CacheHit, sampling: SamplingConfig,
               limit: int) -> tuple[CacheHit, CacheEvent]:
        """An exact hit the target must check: one forward over the cached answer, as far as this request's
        ``limit`` of new tokens serves it (:func:`engine.divergence.first_disagreement`). Served as ``exact``
        when the target would give every token (rounding ties aside); otherwise it becomes the draft of a
        ``verified`` answer that replaces it. A sampled answer is always drawn again, the cached one its draft."""
        at, answer = None, list(hit.answer_token_ids)
        if sampling.greedy:
            with self._lock:
                at = first_disagreement(pair.target, prompt_ids, answer[:limit], ends=len(answer) < limit)
            if at is None:
                hit = replace(hit, needs_check=False, reason="")
                return hit, hit.to_event()
            why = f"the target disagrees with the cached answer at token {at + 1}; its own answer replaces it"
        else:
            why = "a sampled answer: the target draws its own, with the cached one as its draft"
        hit = replace(hit, outcome="verified", reason=why, refuted=at is not None)
        return hit, hit.to_event()

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: the reference every speculative answer must match."""
        pair = self.require_pair()
        prompt_ids = self.encode(messages, pair)
        stream = self._stream(pair.target, prompt_ids, sampling)
        decoder = reference_generate(self._runner(pair.target), prompt_ids, stream, sampling, cancel)
        yield from self._stepwise(decoder, pair)

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
            # on the CPU: two fp32 copies (about 8 GB for the default pair) must not take GPU memory
            self._fp32[loaded.name] = load_model(loaded.name, "fp32", device=torch.device("cpu"),
                                                 cache_dir=self.cache_dir)
        return self._fp32[loaded.name]

    def prove_fp32(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig) -> Fp32Proof:
        """Target-only and speculative again with fp32 copies of the pair (on the CPU, loaded once and kept
        while this pair stays), cache off."""
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
        yield from self._stepwise(run_grid(grid, pool, cancel), pair)

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
        search = self.cache.search
        backend = f"{self.cache.location}, searched by {search}" if search else self.cache.location
        return CacheInfo(available=True, threshold=self.cache.threshold, backend=backend)

    def cache_stats(self) -> CacheStats | None:
        return None if self.cache is None else self.cache.stats()

    def cache_entries(self, limit: int = 50) -> list[CacheEntry]:
        return [] if self.cache is None else self.cache.entries(limit)

    def cache_delete(self, key: str) -> bool:
        return self.cache is not None and self.cache.delete(key)

    def cache_clear(self) -> None:
        if self.cache is not None:
            self.cache.clear()
