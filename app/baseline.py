"""The target-only speed on this machine, measured once per target/precision/device and kept in a JSON file.

The break-even meter divides the speculative tokens/s by this number.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from engine.models.catalog import cache_root
from engine.config import SamplingConfig
from engine.events import final_done
from engine.surface import EngineSurface, PairInfo

log = logging.getLogger(__name__)

BASELINE_PROMPT = "List the numbers from one to forty in words, separated by commas."
BASELINE_TOKENS = 32
WARMUP_TOKENS = 4
RUNS = 2  # keep the faster run: other processes on a busy machine only ever slow a run down


def baseline_path() -> Path:
    return cache_root() / "baselines.json"


def baseline_key(info: PairInfo) -> str:
    """Target-only speed depends on the target, its precision and the device (not on the draft)."""
    return f"{info.target}|{info.target_precision}|{info.device}"


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
        with self._lock:
            self._memory[key] = record
            data = {**self._read(), **self._memory}
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
                tmp.replace(self.path)
            except OSError as err:
                self.write_error = (f"could not save the measured speed to {self.path} ({err.strerror or err}); "
                                    "it is kept in memory until the app stops")
                log.warning(self.write_error)


def _run_reference(engine: EngineSurface, n_tokens: int):
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=n_tokens, stop_on_eos=False)
    return final_done(engine.generate_reference([{"role": "user", "content": BASELINE_PROMPT}], sampling))


def measure_baseline(engine: EngineSurface) -> dict:
    """Short greedy target-only generations (after a tiny warm-up) with the engine's reference decoder."""
    _run_reference(engine, WARMUP_TOKENS)
    stats = max((_run_reference(engine, BASELINE_TOKENS).stats for _ in range(RUNS)), key=lambda s: s.tokens_per_s)
    when = time.strftime("%Y-%m-%d %H:%M")
    return {
        "tokens_per_s": stats.tokens_per_s,
        "tokens": stats.new_tokens,
        "seconds": stats.elapsed_s,
        "measured_at": when,
        "how": (f"best of {RUNS} runs of {stats.new_tokens} greedy tokens (prefill included) with the "
                f"target-only reference decoder on a fixed prompt, {when}"),
    }


def get_or_measure(engine: EngineSurface, store: BaselineStore, remeasure: bool = False) -> dict:
    key = baseline_key(engine.info())
    record = None if remeasure else store.get(key)
    if record is None:
        record = measure_baseline(engine)
        store.put(key, record)
    return record
