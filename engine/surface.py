"""What the app may call on the engine: one typed ``Protocol``, and the small frozen values it returns.

``engine.chat_engine.ChatEngine`` satisfies it; the app holds its engine as an ``EngineSurface`` and calls nothing
else (no attributes: cache settings and statistics come through methods too). Benchmarks and tests use the same
surface; the members they alone need (the loaded ``target`` and ``draft``, ``use_models``, ``encode``) are on it
too, so there is one API to the engine. This module imports nothing
heavy (no torch, no transformers): the app imports it, and the app never imports torch.

Beside the Protocol, this module re-exports what the app builds or reads from the parts below it: the cache's
values (``CacheStats``, ``CacheEntry``) and its ``StoreUnavailable``, the model catalog's names and cache folder,
the experiment grid and its parsers, the result columns and the step costs. The app imports from ``engine`` only
this module, ``engine.config`` (the settings, validated once), ``engine.errors`` and ``engine.events`` (what it
renders); tests/project/test_layout.py holds it to that list.
"""
from __future__ import annotations

import inspect
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from engine.cache.stats import CacheEntry, CacheStats
from engine.cache.store import StoreUnavailable
from engine.config import DEFAULT_CACHE, CacheConfig, SamplingConfig, SpecConfig
from engine.costs.costmodel import StepCosts
from engine.events import Event
from engine.lab.grid import (DOCTOR_KINDS, LAB_PROPOSERS, OWN, PROMPT_SETS, ExperimentGrid, estimated_seconds,
                             own_prompts, parse_ks, parse_names, parse_temperatures)
from engine.lab.results import COLUMNS, RESULT_VERSION, DoctorReport, LabUpdate
from engine.models.catalog import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, cache_root
from engine.models.load_checks import TargetSpeed

if TYPE_CHECKING:  # engine.divergence imports torch, engine.models.loading too; the app reads these by attribute
    from engine.divergence import Divergence, Fp32Proof
    from engine.models.loading import LoadedModel

__all__ = [  # the re-exports the app imports from here, beside the Protocol and its values below
    "BUILTIN_MODELS", "COLUMNS", "DEFAULT_DRAFT", "DEFAULT_TARGET", "DOCTOR_KINDS", "LAB_PROPOSERS", "OWN",
    "PROMPT_SETS", "RESULT_VERSION", "CacheEntry", "CacheStats", "DoctorReport", "ExperimentGrid", "LabUpdate",
    "StepCosts", "StoreUnavailable", "TargetSpeed", "cache_root", "estimated_seconds", "own_prompts", "parse_ks", "parse_names",
    "parse_temperatures",
    "CacheInfo", "EngineSurface", "PairInfo", "SURFACE_MEMBERS", "surface_problems",
]


@dataclass(frozen=True)
class PairInfo:
    target: str
    draft: str
    target_precision: str
    draft_precision: str
    device: str
    precision_note: str = ""  # why these precisions, e.g. "AVX2 CPU (...) -> target int8-dynamic (auto), ..."
    costs: StepCosts | None = None  # the step costs measured on this machine (None while measuring)
    # greedy speculative output is bit-for-bit the target's: measured when the pair loaded, every row of the
    # loop's verify widths equal to the same token fed alone (engine/decode/identity.py); False: identical up to
    # rounding ties, or not measured
    bit_identical: bool = False
    identity_note: str = ""  # that measurement in words: "verified bit-identical on this machine: 106/106 rows (...)"
    identity_drift_steps: float = 0.0  # the largest drift it found, in rounding steps of the top logit
    runner: str = ""  # what runs the models: "torch, speclens-row-exact attention" or "llama.cpp 2 threads, ..."
    # where identity holds only up to some verify width: "identical" (an adaptive k keeps to it) or "fastest", and
    # what each costs (engine/serve/verify_mode.py); "" where there is no such choice
    verify_mode: str = ""
    verify_note: str = ""
    # the widest forward whose rows the check found equal to rows fed alone, where wider ones differ (None: no such
    # width); ``identical`` keeps verifies to it and computes prompts as a fresh prefill does (Runner.resume)
    identity_width_cap: int | None = None
    # the load-time figures are measured beside serving (engine/serve/measuring.py): True until they are in
    measuring: bool = False
    checks_note: str = ""  # when and how they were measured, or why they are flagged (a busy machine)
    checks_flagged: bool = False  # measured on a busy machine: used for now, never kept (checks_note says why)
    target_speed: TargetSpeed | None = None  # the target-only speed measured with them


@dataclass(frozen=True)
class CacheInfo:
    """The semantic cache's settings: what the cache controls start from."""
    available: bool  # False: this engine runs without a semantic cache (see the launch log)
    threshold: float = DEFAULT_CACHE.threshold  # the similarity a semantic hit needs, unless a request says
    backend: str = ""  # where the entries live, safe to show (passwords masked)
    judge: str = ""  # direct mode's paraphrase judge for the loaded target, in words ("" before a pair loads)


@runtime_checkable
class EngineSurface(Protocol):
    """Everything the app calls on the engine. ``surface_problems`` checks an implementation (or a test fake)
    against it: the same members, with the same parameters."""

    def load_pair(self, target: str = DEFAULT_TARGET, draft: str = DEFAULT_DRAFT,
                  target_precision: str | None = None, draft_precision: str | None = None) -> PairInfo:
        """Load both models and check they can pair; on any error the previous pair stays."""
        ...

    def info(self) -> PairInfo:
        """The loaded pair; raises NoPairError when none is loaded."""
        ...

    def use_models(self, target: LoadedModel, draft: LoadedModel) -> None:
        """Install models already loaded (a benchmark's, a test's) as the pair, their figures measured now."""
        ...

    @property
    def target(self) -> LoadedModel:
        """The loaded target model (benchmarks and tests drive it directly; the app reads ``info()``)."""
        ...

    @property
    def draft(self) -> LoadedModel:
        """The loaded draft model."""
        ...

    def encode(self, messages: list[dict]) -> list[int]:
        """The token ids the target is fed for ``messages`` (its chat template, within its context window)."""
        ...

    def remeasure(self) -> PairInfo:
        """Measure the loaded pair's figures again, beside serving (``PairInfo.measuring`` until they are in)."""
        ...

    def wait_measured(self, timeout: float | None = None) -> PairInfo:
        """The loaded pair once its load-time figures are in (a script's or a benchmark's wait); a pair still
        measuring when ``timeout`` passes is returned as it is."""
        ...

    def set_verify_mode(self, mode: str) -> PairInfo:
        """``identical`` or ``fastest`` for the loaded pair (PairInfo.verify_note prices each); InvalidSettingError
        for another mode, or where the pair has no such choice."""
        ...

    def generate(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig, *,
                 cache: CacheConfig = CacheConfig(), cancel: threading.Event | None = None,
                 prediction: str = "", memory_scope: str = "") -> Iterator[Event]:
        """A CacheEvent, then TokenEvents and StatsEvents, then a DoneEvent (with ``prompt_tokens``).
        ``prediction``: text the answer is expected to restate (OpenAI's predicted outputs), a free draft the
        target verifies; the StatsEvents count its tokens apart (``of_source("prediction")``). ``memory_scope``:
        whose earlier prompts and answers may draft this one (the instance's memory of earlier work, counted as
        ``of_source("memory")``); the answer joins that scope's memory."""
        ...

    def generate_reference(self, messages: list[dict], sampling: SamplingConfig,
                           cancel: threading.Event | None = None) -> Iterator[Event]:
        """Target-only decoding: TokenEvents and StatsEvents, then a DoneEvent."""
        ...

    def explain_divergence(self, messages: list[dict], reference_ids: list[int],
                           other_ids: list[int]) -> Divergence | None:
        ...

    def prove_fp32(self, messages: list[dict], sampling: SamplingConfig, spec: SpecConfig) -> Fp32Proof:
        ...

    def run_experiment(self, grid: ExperimentGrid, cancel: threading.Event | None = None) -> Iterator[LabUpdate]:
        """Progress updates, a row per finished cell, and last an update with the whole result (engine/lab)."""
        ...

    def pair_doctor(self, kinds: tuple[str, ...] = DOCTOR_KINDS, probe_tokens: int = 24,
                    cancel: threading.Event | None = None) -> DoctorReport:
        """The loaded pair's checks and costs, and a short acceptance probe per prompt kind."""
        ...

    def cache_info(self) -> CacheInfo:
        ...

    def cache_stats(self) -> CacheStats | None:
        """None when there is no semantic cache."""
        ...

    def cache_entries(self, limit: int = 50) -> list[CacheEntry]:
        """Newest first."""
        ...

    def cache_delete(self, key: str) -> bool:
        """Whether the entry existed."""
        ...

    def cache_clear(self) -> None:
        ...

    def memory_clear(self) -> None:
        """Forget every earlier prompt and answer the memory proposer drafts from (a benchmark's fresh state)."""
        ...


SURFACE_MEMBERS = tuple(name for name, member in vars(EngineSurface).items() if not name.startswith("_")
                        and (callable(member) or isinstance(member, property)))


def _parameters(fn) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter; annotations are left out (fakes need not repeat them)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


_MISSING = object()


def surface_problems(cls: type) -> list[str]:
    """What keeps ``cls`` from being an EngineSurface: each member it lacks, or whose parameters (names, kinds,
    defaults, order) differ from the Protocol's. Empty when it conforms."""
    problems = []
    for name in SURFACE_MEMBERS:
        impl = inspect.getattr_static(cls, name, _MISSING)
        if impl is _MISSING:
            problems.append(f"{cls.__name__}.{name} is missing")
        elif isinstance(getattr(EngineSurface, name), property):
            if not isinstance(impl, property):
                problems.append(f"{cls.__name__}.{name} is not a property, as EngineSurface.{name} is")
        elif _parameters(getattr(cls, name)) != _parameters(getattr(EngineSurface, name)):
            problems.append(f"{cls.__name__}.{name}{inspect.signature(getattr(cls, name))} differs from "
                            f"EngineSurface.{name}{inspect.signature(getattr(EngineSurface, name))}")
    return problems
