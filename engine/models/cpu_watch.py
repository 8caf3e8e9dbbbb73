"""How much of this machine's CPU other processes took while something was timed: a timing taken while they took
more than ``BUSY_SHARE`` of all CPUs prices the machine's load, not the work. Used by the load's measurements
(engine/serve/measuring.py) and the repack probe's child (engine/models/repack_probe.py)."""
from __future__ import annotations

import os
import time
from collections.abc import Callable

BUSY_SHARE = 0.25  # other processes taking more than this share of all CPUs make a measurement busy


def others_busy(others: float | None) -> bool:
    """Whether other processes took more than ``BUSY_SHARE`` of all CPUs (None: the system does not say, not busy)."""
    return others is not None and others > BUSY_SHARE


def others_reason(others: float | None, during: str) -> str:
    """"other processes took N% of the CPUs while ``during``" where they took more than ``BUSY_SHARE``; else ""."""
    return f"other processes took {others:.0%} of the CPUs while {during}" if others_busy(others) else ""


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds every process has used, CPU seconds this process has used), or None where the system does not
    say (no /proc/stat)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            values = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    busy = sum(values[:8]) - values[3] - (values[4] if len(values) > 4 else 0)  # all but idle and iowait
    mine = os.times()
    return busy / os.sysconf("SC_CLK_TCK"), mine.user + mine.system


class CpuWatch:
    """The share of all CPUs that other processes took between ``start`` and ``others_share``."""

    def __init__(self, read: Callable[[], tuple[float, float] | None] = cpu_seconds,
                 clock: Callable[[], float] = time.monotonic, cpus: int | None = None):
        self._read, self._clock, self.cpus = read, clock, cpus or os.cpu_count() or 1
        self._start: tuple[float, tuple[float, float] | None] | None = None

    def start(self) -> CpuWatch:
        self._start = (self._clock(), self._read())
        return self

    def others_share(self) -> float | None:
        """None where the system does not say."""
        began, first = self._start
        now = self._read()
        wall = self._clock() - began
        if first is None or now is None or wall <= 0:
            return None
        others = (now[0] - first[0]) - (now[1] - first[1])
        return max(0.0, others) / (wall * self.cpus)
