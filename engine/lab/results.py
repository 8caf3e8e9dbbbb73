"""What an experiment yields: progress updates, one row per cell, and the pair doctor's report. Pure Python.

A row is a plain dict (it goes to JSON, CSV and the table as is). ``cell_row`` turns the per-prompt runs of one
cell and their target-only baselines into it; the prediction is the cost model's (engine.costs.costmodel) for
the cell's measured per-token acceptance alpha.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from engine.config import FREE_PROPOSERS
from engine.lab.grid import ADAPTIVE, Cell, ExperimentGrid, bench_command
from engine.costs.costmodel import StepCosts
from engine.events import Acceptance

RESULT_VERSION = 1
# the table's columns, in order (the rows carry more: token ids, accept counts, costs)
COLUMNS = ("cell", "prompt_set", "k", "temperature", "proposer", "draft", "draft_precision", "target_precision",
           "tokens_per_s", "baseline_tokens_per_s", "speedup", "predicted_speedup", "acceptance", "alpha",
           "mean_accepted", "identical", "distribution_p", "new_tokens", "command")


@dataclass(frozen=True)
class LabUpdate:
    """One step of a run: progress, a note (e.g. a model loading), a finished cell's row, or the whole result."""
    done: int  # generations finished
    total: int
    message: str
    row: dict | None = None
    result: dict | None = None  # only on the last update
    loading: bool = False  # the message says a model is loading
    type: str = "lab"


@dataclass(frozen=True)
class PromptRun:
    """One generation: what the row needs from its DoneEvent."""
    token_ids: tuple[int, ...]
    seconds: float
    acceptance: Acceptance = Acceptance()
    cancelled: bool = False


def predicted_speedup(costs: StepCosts, cell: Cell, alpha: float, mean_k: float) -> float | None:
    """The cost model's speedup for this cell: its k (adaptive: the mean drafted length), its alpha. A free
    proposer's draft (FREE_PROPOSERS) costs nothing to make."""
    k = mean_k if cell.k == ADAPTIVE else cell.k
    if k <= 0:
        return None
    if cell.proposer in FREE_PROPOSERS:
        costs = replace(costs, draft_per_token_s=0.0)
    return costs.speedup(alpha, k)


def cell_row(grid: ExperimentGrid, cell: Cell, runs: list[PromptRun], baseline: list[PromptRun],
             costs: StepCosts, fidelity: dict | None, used: tuple[str, str] | None = None) -> dict:
    """``used``: the (target, draft) precisions the models loaded with (``auto`` resolved on this machine)."""
    tokens = sum(len(r.token_ids) for r in runs)
    seconds = sum(r.seconds for r in runs)
    base_tokens, base_seconds = sum(len(r.token_ids) for r in baseline), sum(r.seconds for r in baseline)
    tps = tokens / seconds if seconds else 0.0
    base_tps = base_tokens / base_seconds if base_seconds else 0.0
    acceptance = sum((r.acceptance for r in runs), Acceptance())
    alpha, mean_k = acceptance.alpha, acceptance.mean_drafted
    greedy = cell.temperature == 0
    same = sum(r.token_ids == b.token_ids for r, b in zip(runs, baseline))
    predicted = predicted_speedup(costs, cell, alpha, mean_k)
    target_used, draft_used = used or (cell.target_precision, cell.draft_precision)
    return {
        "cell": cell.key, "series": cell.series, "prompt_set": cell.prompt_set, "k": cell.k,
        "temperature": cell.temperature, "proposer": cell.proposer, "target": grid.target, "draft": cell.draft,
        "draft_precision": cell.draft_precision, "target_precision": cell.target_precision,
        "target_precision_used": target_used, "draft_precision_used": draft_used,
        "prompts": len(runs), "new_tokens": tokens, "seconds": seconds, "tokens_per_s": tps,
        "baseline_tokens_per_s": base_tps, "speedup": tps / base_tps if base_tps else None,
        "predicted_speedup": predicted, "acceptance": acceptance.acceptance_rate, "alpha": alpha,
        "mean_accepted": acceptance.mean_accepted, "mean_k": mean_k,
        "acceptance_by_position": list(acceptance.rate_by_pos),
        "identical": f"{same}/{len(runs)}" if greedy else None, "identical_all": (same == len(runs)) if greedy else None,
        "distribution_p": fidelity["p_value"] if fidelity else None, "distribution_check": fidelity,
        "token_ids": [list(r.token_ids) for r in runs], "accepted_counts": [r.acceptance.accepted for r in runs],
        "costs": asdict(costs), "command": bench_command(grid, cell),
    }


@dataclass(frozen=True)
class DoctorReport:
    """The pair doctor: can these two pair, what they cost here, and what speedup to expect per prompt kind."""
    target: str
    draft: str
    target_precision: str
    draft_precision: str
    vocab_same: bool
    vocab_sizes: tuple[int, int]  # (target, draft)
    template_same: bool
    template_note: str
    memory_gb: dict  # precision -> {"target": GB, "draft": GB} (weights only)
    kv_mb_per_1k_tokens: dict  # "target" / "draft" -> MB of KV cache per 1000 tokens (bf16)
    t_draft_s: float  # one draft token
    t_verify_s: dict  # n fed tokens -> seconds of one target forward
    costs: StepCosts  # the line fitted through t_verify, and t_draft
    break_even: dict  # k -> the acceptance alpha at which k pays, or None (never)
    probes: dict = field(default_factory=dict)  # kind -> {"alpha", "prompts", "best_k", "predicted": {k: speedup}}

    def to_dict(self) -> dict:
        return asdict(self)
