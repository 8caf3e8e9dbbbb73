"""The load-time figures kept between launches: quiet ones only, per machine, model file, precision and runtime build
(a JSON file in the cache directory), so a second launch on the same machine serves with them at once; a pair no file
names (torch runs it) keeps them with its loaded objects, for this process only."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import weakref
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
    """The model file, precision and runtime build its figures hold for; None where no file names it (a test's model,
    or one torch runs: measured at each load, its figures kept with the loaded objects: ``LoadedPairs``)."""
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


class LoadedPairs:
    """Quiet figures of pairs that no file names (torch-run models: ``pair_key`` is None), held for as long as those
    very loaded objects live in this process: another engine on them (a test's, a bench's) is not measured again,
    while a new load of the same model is. Process-wide, as the objects are."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[tuple[int, int], tuple[weakref.ref, weakref.ref, LoadChecks]] = {}

    def get(self, target: LoadedModel, draft: LoadedModel) -> LoadChecks | None:
        with self._lock:
            held = self._held.get((id(target), id(draft)))
        return held[2] if held and held[0]() is target and held[1]() is draft else None

    def put(self, target: LoadedModel, draft: LoadedModel, checks: LoadChecks) -> None:
        with self._lock:
            self._held = {ids: held for ids, held in self._held.items() if held[0]() and held[1]()}  # the dropped go
            self._held[(id(target), id(draft))] = (weakref.ref(target), weakref.ref(draft), checks)

    def forget(self, target: LoadedModel, draft: LoadedModel) -> None:
        with self._lock:
            self._held.pop((id(target), id(draft)), None)


LOADED_PAIRS = LoadedPairs()


class MeasuredStore:
    """Quiet figures of a pair: by ``pair_key`` in a JSON file (a directory that cannot be written keeps them in
    memory), or, for a pair no file names, by its loaded objects (``LOADED_PAIRS``)."""

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

    def get(self, models: tuple[LoadedModel, LoadedModel]) -> LoadChecks | None:
        key = pair_key(*models)
        if key is None:
            return LOADED_PAIRS.get(*models)
        with self._lock:
            record = self._memory.get(key) or self._read().get(key)
        try:
            return LoadChecks.from_json(record) if record else None
        except (KeyError, TypeError, ValueError):  # a record of an older shape: measured again
            return None

    def put(self, models: tuple[LoadedModel, LoadedModel], checks: LoadChecks) -> None:
        if checks.busy:
            return
        key = pair_key(*models)
        if key is None:
            LOADED_PAIRS.put(*models, checks)
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

    def forget(self, models: tuple[LoadedModel, LoadedModel]) -> None:
        key = pair_key(*models)
        if key is None:
            LOADED_PAIRS.forget(*models)
            return
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
