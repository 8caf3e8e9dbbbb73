"""The target-only speed on this machine as the app shows it: the engine measures it beside serving, with the
pair's other load-time figures (engine/serve/measuring.py, ``PairInfo.target_speed``); here it becomes the record
the views read, and the quiet ones are remembered in a JSON file per target, precision and device, for the
experiment grid's time estimates of targets not loaded now.

The break-even meter divides an answer's decode rate by the decode rate here, and an experiment grid's time estimate
(``grid_estimate``) multiplies by the inverse of the end-to-end rate.
"""
from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

from engine.config import AUTO
from engine.surface import ExperimentGrid, PairInfo, cache_root, estimated_seconds

log = logging.getLogger(__name__)


def baseline_path() -> Path:
    return cache_root() / "baselines.json"


def speed_key(target: str, precision: str, device: str) -> str:
    """Target-only speed depends on the target, its precision and the device (not on the draft)."""
    return f"{target}|{precision}|{device}"


def baseline_key(info: PairInfo) -> str:
    return speed_key(info.target, info.target_precision, info.device)


class BaselineStore:
    """A JSON file of measurements keyed by ``baseline_key``. Thread-safe; survives restarts.

    When the file cannot be written (a read-only cache directory), measurements are kept in memory for this
    run and ``write_error`` says why.
    """

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else baseline_path()
        self._lock = threading.Lock()
        self._memory: dict[str, dict] = {}
        self.write_error: str | None = None

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict | None:
        with self._lock:
            return self._memory.get(key) or self._read().get(key)

    def put(self, key: str, record: dict) -> None:
        """Keep ``record``: in the file when it was measured on a quiet machine, in memory only when it is flagged
        (a busy machine's figure is used for this run, never kept as the truth)."""
        with self._lock:
            self._memory[key] = record
            if record.get("flagged"):
                return
            data = {**self._read(), **{k: r for k, r in self._memory.items() if not r.get("flagged")}}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
                tmp.replace(self.path)
            except OSError as err:
                self.write_error = (f"could not save the measured speed to {self.path} ({err.strerror or err}); "
                                    "it is kept in memory until the app stops")
                log.warning(self.write_error)


def speed_record(pair: PairInfo) -> dict | None:
    """The loaded pair's target-only speed as the views read it (None while it is measured); ``flagged``: measured
    on a busy machine (``PairInfo.checks_note`` says so)."""
    speed = pair.target_speed
    if speed is None:
        return None
    return {"tokens_per_s": speed.tokens_per_s, "decode_tokens_per_s": speed.decode_tokens_per_s,
            "first_token_s": speed.first_token_s, "tokens": speed.tokens, "flagged": pair.checks_flagged,
            "how": f"{speed.how}; {pair.checks_note}"}


def grid_speed(store: BaselineStore, grid: ExperimentGrid, loaded: PairInfo | None) -> dict | None:
    """The slowest target-only speed measured on this machine (``loaded``'s device) for the grid's target at
    each of its precisions (``auto``: the loaded target's, when it is the grid's target), its ``precision``
    added; None when one of them was never measured here."""
    if loaded is None:
        return None
    records = []
    for precision in grid.target_precisions:
        if precision == AUTO and grid.target == loaded.target:
            precision = loaded.target_precision
        record = store.get(speed_key(grid.target, precision, loaded.device))
        if record is None:
            return None
        records.append({**record, "precision": precision})
    return min(records, key=lambda r: r["tokens_per_s"])


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


def grid_estimate(store: BaselineStore, grid: ExperimentGrid, loaded: PairInfo | None) -> tuple[float | None, str]:
    """How long ``grid`` takes here, in seconds (None: no speed measured on this machine for its target), and
    the sentence that says so and from what."""
    speculative, target_only = grid.generations()
    work = (f"{speculative + target_only} generations ({speculative} speculative, {target_only} target-only) of up "
            f"to {grid.max_new_tokens} new tokens")
    speed = grid_speed(store, grid, loaded)
    if speed is None:
        return None, (f"{work}; no target-only speed of {grid.target} at {', '.join(grid.target_precisions)} has "
                      "been measured on this machine yet, so there is no time estimate")
    seconds, when = estimated_seconds(grid, speed["tokens_per_s"]), speed.get("measured_at")
    return seconds, (f"about {duration(seconds)}: {work} at {speed['tokens_per_s']:.1f} tok/s, the target-only "
                     f"speed of {grid.target} ({speed['precision']}) measured on this machine"
                     f"{f' on {when}' if when else ''}"
                     f"{' while it was busy (flagged)' if speed.get('flagged') else ''}; loading models comes on top")
