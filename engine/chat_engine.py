"""The engine as the app sees it: a thin facade over small parts (engine/serve/), each with one job.

The pair's lifecycle is the PairSlot's, the model lock and its error mapping the ModelLock's, generation with
the cache in front engine/serve/generation.py's, the proofs engine/serve/proofs.py's; experiments and the pair
doctor are engine/lab's. Forwards run one step at a time under the lock, never held while a caller runs, so no
call order can deadlock; loading a new pair leaves the old one in place until the new one has passed the check.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

from engine.cache.judge import judge_line
from engine.cache.semantic_cache import SemanticCache
from engine.config import CacheConfig, SamplingConfig, SpecConfig
from engine.divergence import Divergence, Fp32Proof
from engine.events import Event
from engine.lab.doctor import diagnose
from engine.lab.experiment import ModelPool, run_grid
from engine.lab.grid import DOCTOR_KINDS, ExperimentGrid
from engine.lab.results import DoctorReport, LabUpdate
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.loading import LoadedModel
from engine.proposers.memory import Memories
from engine.serve import generation, proofs
from engine.serve.model_lock import ModelLock
from engine.serve.pair_slot import NO_JUDGE, PairSlot
from engine.serve.run_ahead import run_ahead
from engine.surface import CacheEntry, CacheInfo, CacheStats, PairInfo


class ChatEngine:
    """Safe to share between threads: a request reads the pair once and uses only that value; swapping the pair
    never waits for a generation. The app calls only its ``engine.surface.EngineSurface`` methods."""

    def __init__(self, cache: SemanticCache | None = None, paraphrase_judge: bool = True,
                 cache_dir: Path | None = None, measure_beside: bool = True, memory: bool = True):
        """``measure_beside``: a loaded pair serves at once and its figures are measured on their own thread
        (engine/serve/measuring.py); False (a benchmark's engine): ``load_pair`` measures them before it returns,
        once, so that nothing measures beside the benchmark. ``memory``: earlier prompts and answers draft later
        ones (engine/proposers/memory.py)."""
        self.cache = cache
        self.memories = Memories() if memory else None
        self.lock = ModelLock()
        self.slot = PairSlot(self.lock, cache_dir, paraphrase_judge, measure_beside)

    # -- the pair -------------------------------------------------------------------------------------------
    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        return self.slot.load(target, draft, target_precision, draft_precision).info()

    def use_models(self, target: LoadedModel, draft: LoadedModel) -> None:
        """Install already-loaded models (tests, benchmarks) and measure their load-time figures now, in this
        thread (where none were kept)."""
        self.slot.install(target, draft, beside=False)

    def info(self) -> PairInfo:
        return self.slot.require().info()

    def remeasure(self) -> PairInfo:
        return self.slot.remeasure().info()

    def wait_measured(self, timeout: float | None = None) -> PairInfo:
        self.slot.measurer.wait(timeout)
        return self.info()

    def set_verify_mode(self, mode: str) -> PairInfo:
        return self.slot.set_verify(mode).info()

    @property
    def target(self) -> LoadedModel:
        return self.slot.require().target

    @property
    def draft(self) -> LoadedModel:
        return self.slot.require().draft

    def encode(self, messages: list[dict]) -> list[int]:
        return generation.encode(self.slot.require(), messages)

    # -- generation -----------------------------------------------------------------------------------------
    def generate(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig, *,
                 cache: CacheConfig = CacheConfig(), cancel: threading.Event | None = None,
                 prediction: str = "", memory_scope: str = "") -> Iterator[Event]:
        """Decoded on its own worker at the engine's pace (engine/serve/run_ahead.py); closing the returned
        generator stops the decode at its next step."""
        pair = self.slot.require()  # read once: a concurrent pair switch affects only later requests
        judging = self.slot.judge(pair, self.lock) if self.cache is not None and cache.mode == "direct" else NO_JUDGE
        cancel = cancel or threading.Event()
        request = generation.ChatRequest(messages, sampling, spec, cache, cancel, prediction, memory_scope)
        yield from run_ahead(generation.answer(pair, self.cache, self.lock, request, judging, self.memories), cancel)

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        cancel = cancel or threading.Event()
        yield from run_ahead(generation.reference(self.slot.require(), self.lock, messages, sampling, cancel), cancel)

    # -- proofs, the lab ------------------------------------------------------------------------------------
    def explain_divergence(self, messages: list[dict], reference_ids: list[int],
                           other_ids: list[int]) -> Divergence | None:
        return proofs.explain(self.slot.require(), self.lock, messages, reference_ids, other_ids)

    def prove_fp32(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig) -> Fp32Proof:
        pair = self.slot.require()
        copies, load_s = self.slot.fp32_copies(pair)
        return proofs.prove_fp32(pair, copies, load_s, self.lock, messages, sampling, spec)

    def run_experiment(self, grid: ExperimentGrid, cancel: threading.Event | None = None) -> Iterator[LabUpdate]:
        """The loaded pair's models and the step costs it measured at load are reused, other pairs load and are
        measured once for this run; each step holds the lock."""
        pair = self.slot.pair
        pool = ModelPool(list(pair.models) if pair else [], self.slot.cache_dir)
        known = {tuple((m.name, m.precision) for m in pair.models): pair.costs} if pair and pair.costs else {}
        cancel = cancel or threading.Event()
        yield from run_ahead(self.lock.stepwise(run_grid(grid, pool, cancel, known), pool.models.values(),
                                                "while experimenting"), cancel, name="speclens-experiment")

    def pair_doctor(self, kinds: tuple[str, ...] = DOCTOR_KINDS, probe_tokens: int = 24,
                    cancel: threading.Event | None = None) -> DoctorReport:
        pair = self.slot.require()
        return self.lock.run(pair.models, "while diagnosing the pair",
                             lambda: diagnose(pair.target, pair.draft, tuple(kinds), probe_tokens, cancel))

    # -- the semantic cache ---------------------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        if self.cache is None:
            return CacheInfo(available=False)
        search = self.cache.search
        backend = f"{self.cache.location}, searched by {search}" if search else self.cache.location
        pair = self.slot.pair
        judge = judge_line(pair.target if pair else None, self.slot.paraphrase_judge)
        return CacheInfo(available=True, threshold=self.cache.config.threshold, backend=backend, judge=judge)

    def cache_stats(self) -> CacheStats | None:
        return None if self.cache is None else self.cache.stats()

    def cache_entries(self, limit: int = 50) -> list[CacheEntry]:
        return [] if self.cache is None else self.cache.entries(limit)

    def cache_delete(self, key: str) -> bool:
        return self.cache is not None and self.cache.delete(key)

    def cache_clear(self) -> None:
        if self.cache is not None:
            self.cache.clear()

    def memory_clear(self) -> None:
        if self.memories is not None:
            self.memories.clear()
