"""One lock over the loaded models, and the one place where a device fault becomes a typed error.

Every path that runs the models takes it: a generation step, the exact-hit check, the paraphrase judge, a
divergence's explanation, the fp32 proof, the pair doctor and an experiment step. An out-of-memory error on any
of them becomes the same DeviceOutOfMemoryError, which says what the models take and what to choose instead.
A generation holds it for one step at a time and never across a yield, so no call order can deadlock. The lock
is first come, first served: two generations at once take turns step by step (a plain lock lets the thread that
just released it take it again before a waiting one wakes, so one answer would starve the other).

Work handed to ``run`` runs on a thread of its own that ends with it, never on the caller's. llama.cpp's CPU kernels
and torch's run their threads as an OpenMP team of the thread that calls them (one libgomp: torch's, loaded first),
and a team lives as long as that thread. Once more of libgomp's threads live than the machine has cores, libgomp
stops spinning at its barriers (``gomp_throttled_spin_count_var``: 100 spins, then a futex sleep), and llama.cpp
meets a barrier at every op: on 2 cores one explanation of a divergence run on the main thread left every later
decode 30% slower (docs/bench.md, "A team left behind"). Generations run on threads of their own
(engine/serve/run_ahead.py), and so does each attempt of the load-time measurement (engine/serve/measuring.py), with
all its pieces in that one thread: a first forward on a new thread costs more, so a thread per piece would time that.
"""
from __future__ import annotations

import contextvars
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Collection, Iterator
from contextlib import closing
from typing import TypeVar

from engine.models.devices import is_out_of_memory, out_of_memory
from engine.models.loading import LoadedModel

T = TypeVar("T")


class FairLock:
    """A lock handed to its waiters in the order they asked (a ticket queue on one condition)."""

    def __init__(self):
        self._changed = threading.Condition(threading.Lock())
        self._waiting: deque[object] = deque()
        self._held = False

    def free(self) -> bool:
        """Nobody holds it and nobody waits for it (a moment's view: the next caller may take it)."""
        with self._changed:
            return not self._held and not self._waiting

    def acquire(self) -> None:
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._held or self._waiting[0] is not ticket:
                    self._changed.wait()
            except BaseException:  # a waiter interrupted gives up its place, or it would block every later one
                self._waiting.remove(ticket)
                self._changed.notify_all()
                raise
            self._waiting.popleft()
            self._held = True

    def release(self) -> None:
        with self._changed:
            self._held = False
            self._changed.notify_all()


class Held:
    """The lock held around work on ``models`` (``what``: e.g. "while generating", for the error message). Used
    with ``with``, as often as needed: the judge holds one for every verdict."""

    def __init__(self, lock: FairLock, models: Collection[LoadedModel], what: str, used: Callable[[], None]):
        self._lock, self.models, self.what, self._used = lock, models, what, used

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, kind, err, traceback) -> bool:
        self._used()
        self._lock.release()
        if err is not None and is_out_of_memory(err) and self.models:
            raise out_of_memory(self.what, list(self.models)) from err
        return False


MEASURING = "while measuring"  # the load-time measurements' work: it does not count as the models being used


class ModelLock:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._lock = FairLock()  # one piece of work on the models at a time, in turn
        self._clock = clock
        # when work other than a measurement last let go of the models: never yet, so a new pair's measurement starts
        # at once (a request arriving after it waits for one piece at most)
        self._used_at = -math.inf

    def over(self, models: Collection[LoadedModel], what: str) -> Held:
        """The lock for work on ``models``: a live collection (a pool's ``values()``) names what it holds when
        the fault comes."""
        return Held(self._lock, models, what, self._mark if what != MEASURING else lambda: None)

    def _mark(self) -> None:
        self._used_at = self._clock()

    def idle_for(self) -> float:
        """Seconds since work other than a measurement last used the models (infinite before any did); 0 while any
        work holds or waits for them. The load-time measurements run their pieces only after a while of this
        (engine/serve/measuring.py)."""
        if not self._lock.free():
            return 0.0
        return max(0.0, self._clock() - self._used_at)

    def run(self, models: Collection[LoadedModel], what: str, work: Callable[[], T]) -> T:
        """``work()`` under the lock, on a thread that ends with it (above: no OpenMP team outlives the work)."""
        with self.over(models, what):
            return run_apart(work)

    def stepwise(self, events: Iterator[T], models: Collection[LoadedModel], what: str) -> Iterator[T]:
        """Compute each item of ``events`` under the lock, hand it over without it: a caller holding a paused
        generator can start another generation (or measure a baseline) in the same thread."""
        held = self.over(models, what)
        with closing(events):  # closing this generator (a cancelled request) closes the decoder too
            while True:
                with held:
                    item = next(events, None)
                if item is None:
                    return
                yield item


def run_apart(work: Callable[[], T]) -> T:
    """``work()`` on a new thread that ends when it does (the caller's context variables copied), its result or its
    error handed back: the OpenMP team its kernels start ends with it, not with the caller's longer-lived thread."""
    context, out = contextvars.copy_context(), {}

    def call() -> None:
        try:
            out["value"] = context.run(work)
        except BaseException as err:  # raised again in the caller's thread
            out["error"] = err
    worker = threading.Thread(target=call, name="speclens-model-work", daemon=True)
    worker.start()
    worker.join()
    if "error" in out:
        raise out["error"]
    return out["value"]
