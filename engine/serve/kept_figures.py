"""The load-time figures kept between launches: quiet ones only, per machine, model file, precision and runtime build
(a JSON file in the cache directory), so a second launch on the same machine serves with them at once."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from engine.models.load_checks import LoadChecks
from engine.models.loading import LoadedModel

log = logging.getLogger(__name__)

STORE_FILE = "measured.json"


def machine_key() -> str:
    """This machine, as its timings depend on it: the CPU's name and flags, and how many CPUs this process sees."""
    name, flags = "", ""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and not name:
                name = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value.strip()
    except OSError:
        import platform
        name = platform.processor() or platform.machine()
    return f"{name}|{hashlib.sha256(flags.encode()).hexdigest()[:12]}|{os.cpu_count()}"


def model_key(model: LoadedModel) -> str | None:
    """The model file, precision and runtime build its figures hold for; None where they are not kept (a model with
    no file of its own: a test's, or one torch runs, which is measured at each launch)."""
    path = getattr(model.backend, "path", None)
    if path is None:
        return None
    try:
        stat = Path(path).stat()
    except OSError:
        return None
    import llama_cpp

    return (f"{Path(path).resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{model.precision}|"
            f"llama-cpp-python {llama_cpp.__version__}|{model.backend.describe()}")


def pair_key(target: LoadedModel, draft: LoadedModel) -> str | None:
    keys = model_key(target), model_key(draft)
    return None if None in keys else "||".join((machine_key(), *keys))


class MeasuredStore:
    """Quiet figures by ``pair_key``, in a JSON file; a directory that cannot be written keeps them in memory."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._memory: dict[str, dict] = {}

    def _read(self) -> dict:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):  # none yet, or a damaged file: measured again
            return {}
        return data if isinstance(data, dict) else {}

    def get(self, key: str | None) -> LoadChecks | None:
        if key is None:
            return None
        with self._lock:
            record = self._memory.get(key) or self._read().get(key)
        try:
            return LoadChecks.from_json(record) if record else None
        except (KeyError, TypeError, ValueError):  # a record of an older shape: measured again
            return None

    def put(self, key: str | None, checks: LoadChecks) -> None:
        if key is None or checks.busy:
            return
        with self._lock:
            self._memory[key] = checks.to_json()
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_suffix(".tmp")
                tmp.write_text(json.dumps({**self._read(), **self._memory}, indent=1), encoding="utf-8")
                tmp.replace(self.path)
            except OSError as err:
                log.warning("could not keep the measured figures in %s (%s): kept in memory until the app stops",
                            self.path, err.strerror or err)

    def forget(self, key: str | None) -> None:
        with self._lock:
            self._memory.pop(key, None)
            data = self._read()
            if key in data:
                del data[key]
                try:
                    self.path.write_text(json.dumps(data, indent=1), encoding="utf-8")
                except OSError:
                    pass


def store_for(cache_dir: Path) -> MeasuredStore:
    return MeasuredStore(Path(cache_dir) / STORE_FILE)
