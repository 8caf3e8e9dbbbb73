"""The target-only speed on this machine, measured once per target/precision/device and kept in a JSON file.

The break-even meter divides the speculative tokens/s by this number.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

from engine.catalog import cache_root
from engine.config import SamplingConfig

BASELINE_PROMPT = "List the numbers from one to forty in words, separated by commas."
BASELINE_TOKENS = 32
WARMUP_TOKENS = 4
RUNS = 2  # keep the faster run: other processes on a busy machine only ever slow a run down


def baseline_path() -> Path:
    return cache_root() / "baselines.json"


def baseline_key(info) -> str:
    """Target-only speed depends on the target, its precision and the device (not on the draft)."""
    return f"{info.target}|{info.target_precision}|{info.device}"


class BaselineStore:
    """A JSON file of measurements keyed by ``baseline_key``. Thread-safe; survives restarts."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else baseline_path()
        self._lock = threading.Lock()

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def get(self, key: str) -> dict | None:
        with self._lock:
            return self._read().get(key)

    def put(self, key: str, record: dict) -> None:
        with self._lock:
            data = self._read()
            data[key] = record
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
            tmp.replace(self.path)


def _run_reference(engine, n_tokens: int):
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=n_tokens, stop_on_eos=False)
    done = None
    for event in engine.generate_reference([{"role": "user", "content": BASELINE_PROMPT}], sampling):
        if event.type == "done":
            done = event
    return done


def measure_baseline(engine) -> dict:
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


def get_or_measure(engine, store: BaselineStore, remeasure: bool = False) -> dict:
    key = baseline_key(engine.info())
    record = None if remeasure else store.get(key)
    if record is None:
        record = measure_baseline(engine)
        store.put(key, record)
    return record
