"""What the UI handlers share: the engine, the baseline store, and one cancel flag per browser session."""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from app.api.live_stream import LiveStreams
from app.baseline import BaselineStore, baseline_key, grid_estimate, speed_record
from engine.errors import NoPairError
from engine.surface import EngineSurface, ExperimentGrid, PairInfo

MAX_SESSIONS = 256


class CancelFlags:
    """session id -> threading.Event of the answer streaming in that session (the stop button sets it)."""

    def __init__(self):
        self._flags: OrderedDict[str, threading.Event] = OrderedDict()
        self._lock = threading.Lock()

    @contextmanager
    def running(self, session: str) -> Iterator[threading.Event]:
        """A fresh cancel flag for the generation that runs in this block; ``cancel`` finds it while the block
        runs. Leaving the block (the end, an error, a closed handler) sets the flag, so the engine stops, and
        forgets it (unless a newer generation of the session replaced it)."""
        flag = threading.Event()
        with self._lock:
            self._flags[session] = flag
            self._flags.move_to_end(session)
            while len(self._flags) > MAX_SESSIONS:
                self._flags.popitem(last=False)
        try:
            yield flag
        finally:
            flag.set()
            with self._lock:
                if self._flags.get(session) is flag:
                    del self._flags[session]

    def cancel(self, session: str) -> bool:
        """Stop the session's running generation; False when none runs (nothing to stop)."""
        with self._lock:
            flag = self._flags.get(session)
        if flag is None:
            return False
        flag.set()
        return True


@dataclass
class AppContext:
    engine: EngineSurface  # engine.chat_engine.ChatEngine; the app never imports it (nor torch)
    baselines: BaselineStore = field(default_factory=BaselineStore)
    cancels: CancelFlags = field(default_factory=CancelFlags)
    live: LiveStreams = field(default_factory=LiveStreams)  # the chat answers' own streams (app/api/live_stream.py)

    def pair(self) -> PairInfo | None:
        """The loaded pair, or None when none is loaded."""
        try:
            return self.engine.info()
        except NoPairError:
            return None

    def speed(self, pair: PairInfo | None) -> dict | None:
        """``pair``'s target-only speed, as the engine measured it on this machine (``PairInfo.target_speed``, the one
        source: app/baseline.py's ``speed_record``), or None while it is measured. A handler reads the pair once
        (``pair()``) and passes that value here and to what it renders, so an answer's meter, its trace and the pair
        line speak of the same pair. The record is also remembered for the experiment grid's estimates of targets
        not loaded later (a flagged one in memory only)."""
        record = None if pair is None else speed_record(pair)
        if record is not None:
            key = baseline_key(pair)
            if self.baselines.get(key) != record:
                self.baselines.put(key, record)
        return record

    def grid_estimate(self, grid: ExperimentGrid) -> tuple[float | None, str]:
        """How long ``grid`` would take at the speeds measured here (app/baseline.py), and the sentence."""
        loaded = self.pair()
        self.speed(loaded)  # the loaded target's speed is among those remembered
        return grid_estimate(self.baselines, grid, loaded)


def session_id(request) -> str:
    return getattr(request, "session_hash", None) or "default"
