"""Run an experiment grid: every cell's prompts speculative, their target-only baselines, one row per cell.

Models load once per (model, precision) per run (``ModelPool``; the engine's loaded pair is reused), and each
(target, draft) pair has its step costs measured once (the engine's loaded pair: those it measured at load). Runs
are seeded: prompt i of a set samples with ``grid.seed + i``, so a rerun of a saved grid gives the same token ids
(greedy) and accept counts (seeded sampling, fixed k; the adaptive k follows measured timings, so its draft lengths
may differ between runs).
"""
from __future__ import annotations

import platform
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import asdict
from pathlib import Path

import torch

from engine.config import SamplingConfig
from engine.decode.sampling import make_generator
from engine.events import DoneEvent, final_done
from engine.lab.fidelity import pit_values, target_probs, uniformity
from engine.lab.grid import Cell, ExperimentGrid
from engine.lab.results import RESULT_VERSION, LabUpdate, PromptRun, cell_row
from engine.models.auto import plan_precisions
from engine.models.load_checks import measure_step_costs
from engine.models.hardware import detect_machine
from engine.models.loading import LoadedModel, check_pair, default_device, load_model, runner_for
from engine.models.prompt import encode_chat
from engine.costs.costmodel import StepCosts
from engine.start.decoders import start_reference, start_speculative


class ModelPool:
    """(name, precision) -> LoadedModel, for one run. ``precision`` may be auto: it resolves per role."""

    def __init__(self, loaded: list[LoadedModel] = (), cache_dir: Path | None = None):
        self.models = {(m.name, m.precision): m for m in loaded}
        self.cache_dir = cache_dir
        self.device = loaded[0].device if loaded else default_device()

    def key(self, name: str, precision: str, role: str) -> tuple[str, str]:
        return name, plan_precisions({role: (name, precision)}, self.device, self.cache_dir).precisions[role]

    def get(self, key: tuple[str, str]) -> LoadedModel:
        if key not in self.models:
            self.models[key] = load_model(key[0], key[1], device=self.device, cache_dir=self.cache_dir)
        return self.models[key]


def machine_info(device: torch.device) -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")), "")
    return {"kind": detect_machine(device.type).describe(), "cpu": cpu or platform.processor(),
            "device": str(device), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "platform": platform.platform()}


def _cpuinfo() -> list[str]:
    try:
        return Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return []


def _prompt_run(done: DoneEvent) -> PromptRun:
    s = done.stats
    return PromptRun(token_ids=tuple(done.token_ids), seconds=s.elapsed_s, acceptance=s.acceptance,
                     cancelled=done.finish_reason == "cancelled")


def run_reference(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig,
                  cancel: threading.Event | None) -> PromptRun:
    return _prompt_run(final_done(start_reference(target, prompt_ids, sampling, cancel=cancel)))


def run_speculative(target: LoadedModel, draft: LoadedModel, costs: StepCosts, cell: Cell, prompt_ids: list[int],
                    sampling: SamplingConfig, cancel: threading.Event | None) -> PromptRun:
    return _prompt_run(final_done(start_speculative(target, draft, prompt_ids, sampling, cell.spec(), costs=costs,
                                                cancel=cancel)))


def distribution_check(target: LoadedModel, prompts: list[list[int]], runs: list[PromptRun],
                       sampling: SamplingConfig, seed: int) -> dict:
    """engine/lab/fidelity.py over the cell's sampled tokens, pooled."""
    generator = make_generator(seed)
    runner = runner_for(target)
    values = []
    for prompt_ids, run in zip(prompts, runs):
        if run.token_ids:
            probs = target_probs(runner, prompt_ids, list(run.token_ids), sampling)
            values += pit_values(probs, list(run.token_ids), generator)
    return uniformity(values).to_dict()


class GridRun:
    """The state of one run: the pool, pairs with measured step costs, baselines, progress."""

    def __init__(self, grid: ExperimentGrid, pool: ModelPool, cancel: threading.Event | None,
                 costs: dict[tuple, StepCosts] | None = None):
        self.grid, self.pool, self.cancel = grid, pool, cancel
        self.cells = grid.cells()
        self.costs: dict[tuple, StepCosts] = dict(costs or {})
        self.baselines: dict[tuple, list[PromptRun]] = {}
        self.done = 0
        self.total = sum(grid.generations())

    def stopped(self) -> bool:
        return self.cancel is not None and self.cancel.is_set()

    def update(self, message: str, **kw) -> LabUpdate:
        return LabUpdate(self.done, self.total, message, **kw)

    def models(self, cell: Cell) -> Generator[LabUpdate, None, tuple[LoadedModel, LoadedModel, StepCosts]]:
        """Load what the cell needs (a note first) and measure the pair's step costs once; yields the notes,
        returns the pair and its costs."""
        keys = (self.pool.key(self.grid.target, cell.target_precision, "target"),
                self.pool.key(cell.draft, cell.draft_precision, "draft"))
        for key in keys:
            if key not in self.pool.models:
                yield self.update(f"Loading {key[0]} ({key[1]})…", loading=True)
                self.pool.get(key)
        target, draft = self.pool.get(keys[0]), self.pool.get(keys[1])
        if keys not in self.costs:
            check_pair(target, draft)
            yield self.update(f"Measuring {target.name} ({target.precision}) with {draft.name} ({draft.precision})…",
                              loading=True)
            self.costs[keys], _ = measure_step_costs(runner_for(target), runner_for(draft))
        return target, draft, self.costs[keys]

    def prompt_ids(self, target: LoadedModel, prompt_set: str) -> list[list[int]]:
        return [encode_chat(target.tokenizer, [{"role": "user", "content": p}], target.context_window)
                for p in self.grid.set_prompts(prompt_set)]

    def baseline(self, target: LoadedModel, cell: Cell, prompts: list[list[int]]) -> Iterator[LabUpdate]:
        key = (target.name, target.precision, cell.temperature, cell.prompt_set)
        if key in self.baselines:
            return
        runs = []
        for i, ids in enumerate(prompts):
            if self.stopped():
                return
            runs.append(run_reference(target, ids, self.grid.sampling(cell.temperature, i), self.cancel))
            self.done += 1
            yield self.update(f"Target only · {cell.prompt_set} · T={cell.temperature:g} · prompt {i + 1}")
        if not any(r.cancelled for r in runs):
            self.baselines[key] = runs

    def cell(self, cell: Cell) -> Iterator[LabUpdate]:
        target, draft, costs = yield from self.models(cell)
        prompts = self.prompt_ids(target, cell.prompt_set)
        yield from self.baseline(target, cell, prompts)
        runs = []
        for i, ids in enumerate(prompts):
            if self.stopped():
                return
            runs.append(run_speculative(target, draft, costs, cell, ids, self.grid.sampling(cell.temperature, i),
                                        self.cancel))
            self.done += 1
            yield self.update(f"{cell.key} · prompt {i + 1}")
        if self.stopped() or any(r.cancelled for r in runs):
            return
        fidelity = None
        if cell.temperature > 0:
            fidelity = distribution_check(target, prompts, runs, self.grid.sampling(cell.temperature, 0),
                                          self.grid.seed)
        base = self.baselines[(target.name, target.precision, cell.temperature, cell.prompt_set)]
        yield self.update(f"Done: {cell.key}", row=cell_row(self.grid, cell, runs, base, costs, fidelity,
                                                                  (target.precision, draft.precision)))


def run_grid(grid: ExperimentGrid, pool: ModelPool, cancel: threading.Event | None = None,
             costs: dict[tuple, StepCosts] | None = None) -> Iterator[LabUpdate]:
    """Progress updates, a row per finished cell, and last an update whose ``result`` is the whole run. ``costs``:
    step costs measured already, by ((target name, precision), (draft name, precision))."""
    run = GridRun(grid, pool, cancel, costs)
    rows, started = [], time.time()
    yield run.update(f"{len(run.cells)} cells, {run.total} generations")
    for cell in run.cells:
        if run.stopped():
            break
        for update in run.cell(cell):
            if update.row is not None:
                rows.append(update.row)
            yield update
    result = {"version": RESULT_VERSION, "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
              "seconds": time.time() - started, "grid": grid.to_dict(), "machine": machine_info(pool.device),
              "stopped": run.stopped(), "rows": rows,
              "prompts": {s: list(grid.set_prompts(s)) for s in grid.all_sets()},
              "step_costs": [{"target": t, "draft": d, **asdict(c)} for (t, d), c in run.costs.items()]}
    message = f"Stopped after {len(rows)} of {len(run.cells)} cells" if run.stopped() else \
        f"Finished {len(rows)} cells"
    yield run.update(message, result=result)
