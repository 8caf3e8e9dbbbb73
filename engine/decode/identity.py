"""Bit-for-bit identity, measured on this machine: every row of a verify forward against the same tokens fed alone.

Greedy speculation gives exactly the target-only tokens when the target computes each token the same inside a
verify forward of n tokens as fed alone. Whether it does depends on the kernels of this CPU or GPU, this
precision and these matrix sizes (an AVX2 CPU and an AVX-512 one round differently), so it is measured when a
pair loads, never assumed: a real prompt, at a short and a long position, at each verify width the loop uses.
A row counts as equal only when all its logits are equal; after each verify forward one more token is fed alone
and compared too, so the KV cache the verify left behind is checked as well.

Works on any ``Runner`` (engine/backends/contract.py: forward, rollback, tokens, reset). Torch is imported only
inside the measurement: the app reads ``IdentityCheck`` without it.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from engine.backends.contract import Runner
from engine.precision import rounding_step

# The verify widths (k + 1) checked: every k up to 7, where the adaptive k spends nearly all its steps on a CPU and
# where llama.cpp's K-quant matmul changes kernel (its tiled path from 8 rows), then k = 8 and the widest model draft
# (k_max 16). Its cost grows with the target's size (docs/models.md).
CHECK_WIDTHS = (2, 3, 4, 5, 6, 7, 8, 9, 17)
SHORT_POSITION, LONG_POSITION = 24, 256  # tokens of the prompt in the cache before each verify

T = TypeVar("T")


def run_now(work: Callable[[], T]) -> T:
    """A measurement's ``step`` when nothing else shares the models: run the piece at once."""
    return work()


@dataclass(frozen=True)
class IdentityCheck:
    """What the check found: rows equal out of rows compared, and the largest drift where they were not."""
    rows_equal: int
    rows: int
    widths: tuple[int, ...]
    positions: tuple[int, ...]
    max_drift_steps: float  # largest |batched - alone| logit, in rounding steps of that row's top logit
    first_unequal: tuple[int, int, int] | None  # (position, width, row) of the first unequal row
    seconds: float
    where: str = ""  # the runner and machine it ran on, e.g. "cpu, speclens-row-exact attention"
    unequal: tuple[tuple[int, int], ...] = ()  # every (position, width) with an unequal row
    position_rows: tuple[tuple[int, int, int], ...] = ()  # (position, rows equal, rows) for each position

    @property
    def equal_by_position(self) -> dict[int, tuple[int, int]]:
        return {pos: (equal, rows) for pos, equal, rows in self.position_rows}

    @property
    def identical(self) -> bool:
        return self.rows > 0 and self.rows_equal == self.rows

    @property
    def identical_width(self) -> int:
        """The widest verify such that every checked width up to it had every row equal at every position (0:
        not even the narrowest)."""
        if not self.rows:
            return 0
        first_unequal = min((width for _, width in self.unequal), default=None)
        return max((w for w in self.widths if first_unequal is None or w < first_unequal), default=0)

    @property
    def width_cap(self) -> int | None:
        """The verify width the adaptive k keeps to so that greedy speculation stays bit-identical: the identical
        width where only wider verifies differ; None where every width is identical, or none is."""
        return None if self.identical or self.identical_width < 2 else self.identical_width

    def describe(self) -> str:
        if not self.rows:
            return "not measured: the context holds no verify of the checked widths at the checked positions"
        span = f"verify widths {self.widths[0]}-{self.widths[-1]}, positions {' and '.join(map(str, self.positions))}"
        if self.identical:
            return f"verified bit-identical on this machine: {self.rows}/{self.rows} rows ({span})"
        pos, width, row = self.first_unequal or (0, 0, 0)
        if self.width_cap:
            cap = self.width_cap
            return (f"verified bit-identical on this machine for verify widths up to {cap} (k <= {cap - 1}, which the "
                    f"adaptive k keeps to) at positions {' and '.join(map(str, self.positions))}; from width "
                    f"{min(w for _, w in self.unequal)} identical up to rounding ties (max drift "
                    f"{self.max_drift_steps:.1f} steps, {self.rows_equal}/{self.rows} rows equal): a fixed k above "
                    f"{cap - 1} may follow the verify width at a near-tie")
        return (f"identical up to rounding ties (max drift {self.max_drift_steps:.1f} steps): "
                f"{self.rows_equal}/{self.rows} rows equal, first unequal at width {width} row {row}, "
                f"position {pos} ({span}); so at a near-tie a greedy answer can follow the verify width, which the "
                f"adaptive k picks from timings: the same prompt may get another answer on a busy machine")


def measure_identity(runner: Runner | Callable[[], Runner], text_ids: list[int], precision: str, widths: tuple[int, ...] = CHECK_WIDTHS,
                     positions: tuple[int, ...] = (SHORT_POSITION, LONG_POSITION), where: str = "",
                     step: Callable[[Callable[[], object]], object] = run_now) -> IdentityCheck:
    """Compare each row of a forward of n tokens (n in ``widths``) at each of ``positions`` with the same tokens
    fed one at a time; a drift is counted in rounding steps of the row's top logit in ``precision``
    (engine.precision.rounding_step). ``text_ids``: a real prompt's ids, repeated when shorter than
    ``max(positions) + max(widths) + 1``. The runner is reset before each position and after the last.

    ``step`` runs each position's work as one piece (a server passes its model lock: requests take turns with the
    pieces); a runner given as a callable is asked for anew in each piece (a pooled one, which a request may have
    used in between)."""
    start = time.perf_counter()
    ids = list(text_ids)
    while len(ids) < max(positions, default=0) + max(widths) + 1:
        ids += list(text_ids)
    tally = _Tally(precision)
    runner_of = runner if callable(runner) else (lambda: runner)
    position_rows = []
    for pos in positions:
        equal, total = tally.equal, tally.total
        step(lambda: _check_position(runner_of(), ids, pos, widths, tally))
        position_rows.append((pos, tally.equal - equal, tally.total - total))
    return IdentityCheck(tally.equal, tally.total, tuple(widths), tuple(positions), tally.drift, tally.first,
                         time.perf_counter() - start, where, tuple(dict.fromkeys(tally.unequal)),
                         tuple(position_rows))


class _Tally:
    def __init__(self, precision: str):
        self.precision, self.equal, self.total, self.drift, self.first = precision, 0, 0, 0.0, None
        self.unequal: list[tuple[int, int]] = []

    def compare(self, batched, alone, where: tuple[int, int, int]) -> None:
        import torch

        self.total += 1
        if torch.equal(batched, alone):
            self.equal += 1
            return
        self.first = self.first or where
        self.unequal.append(where[:2])
        step = rounding_step(self.precision, float(alone.max()))
        self.drift = max(self.drift, float((batched - alone).abs().max()) / step)


def _check_position(runner: Runner, ids: list[int], pos: int, widths: tuple[int, ...], tally: _Tally) -> None:
    """At ``pos`` (the prompt prefilled up to there, on an emptied runner): the rows of each width, then one token fed
    alone after it. The runner is left emptied."""
    import torch

    runner.reset()
    if pos:
        runner.forward(ids[:pos], n_logits=1)  # the prompt up to here, one prefill
    widest = max(widths)
    alone = torch.cat([runner.forward([t], n_logits=1) for t in ids[pos:pos + widest + 1]])  # (widest + 1, vocab)
    for width in widths:
        runner.rollback(pos)
        batched = torch.cat([runner.forward(ids[pos:pos + width], n_logits=width),
                             runner.forward([ids[pos + width]], n_logits=1)])  # (width + 1, vocab)
        for row in range(width + 1):
            tally.compare(batched[row], alone[row], (pos, width, row))
    runner.reset()
