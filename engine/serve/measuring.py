"""Serve first, measure beside: a pair serves as soon as its models load, and what the load measures on this machine
(the step costs, the identity check, the target-only speed: engine/models/load_checks.py) runs on its own thread.

Each piece of a measurement (one verify width's timings, one identity position, one reference token) runs under the
model lock, and only once no request has used the models for ``IDLE_S``: a request waits for one piece at most, and
a busy server measures in its pauses. Until the figures are in, the pair says "measuring" and an adaptive k runs
target-only steps: speculation waits for this machine's prices, and the answer is the target's own.

Quiet figures are kept per machine, model file and runtime build (engine/serve/kept_figures.py), so a second launch
has them at once. A measurement is busy when other processes took more than ``BUSY_SHARE`` of
the CPUs while it ran, or its timing rounds never agreed. A busy one is used for this run and flagged, never kept,
and measured again later (backing off); the verify mode's default is chosen from quiet figures only.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable

from engine.config import SamplingConfig
from engine.models.cpu_watch import CpuWatch, others_busy, others_reason
from engine.models.load_checks import LoadChecks, TargetSpeed, check_identity, measure_step_costs
from engine.models.loading import LoadedModel, runner_for
from engine.models.prompt import encode_chat
from engine.serve.kept_figures import MeasuredStore
from engine.serve.model_lock import MEASURING, ModelLock, run_apart
from engine.start.decoders import start_reference

log = logging.getLogger(__name__)

IDLE_S = 1.0  # a piece runs only after the models have had no request for this long
# timing rounds that still differ this much after every round: a machine too busy to repeat itself (a quiet 2-core
# VM's rounds differ by up to a fifth at a width; noise within that is absorbed by taking the minimum)
BUSY_SPREAD = 0.5
RETRY_S, RETRY_MOST_S = 30.0, 600.0  # a busy measurement is taken again after this, doubling up to the most

# the target-only speed: one prompt a run, none seen before (each run prefills its prompt as a new request does)
SPEED_PROMPTS = ("List the numbers from one to forty in words, separated by commas.",
                 "Name forty animals in alphabetical order, separated by commas.",
                 "Write the first forty multiples of seven, separated by commas.")
SPEED_TOKENS, WARMUP_TOKENS = 32, 4


def busy_reason(spread: float, others: float | None) -> str:
    """Why a measurement's timings are not to be trusted; "" when the machine was quiet."""
    reason = others_reason(others, "it ran")
    reasons = [reason] if reason else []
    if spread > BUSY_SPREAD:
        reasons.append(f"its last two timing rounds differed by {spread:.0%}")
    return "; ".join(reasons)


# -- the measurement ------------------------------------------------------------------------------------------------
def idle_step(lock: ModelLock, models, idle_s: float = IDLE_S, stop: threading.Event | None = None,
              alive: Callable[[], bool] = lambda: True, sleep: Callable[[float], None] = time.sleep) -> Callable:
    """A measurement's ``step``: wait until no request has used the models for ``idle_s``, then run the piece under
    the model lock. ``stop`` set, or not ``alive()`` (the engine was dropped): the measurement gives up."""
    def step(work):
        while True:
            if (stop is not None and stop.is_set()) or not alive():
                raise Superseded()
            if lock.idle_for() >= idle_s:
                with lock.over(models, MEASURING):  # in the measurement's thread (Measurer._run: no team outlives it)
                    return work()
            sleep(0.05)
    return step


class Superseded(Exception):
    """The pair being measured is no longer the loaded one."""


def target_speed(target: LoadedModel, step: Callable) -> TargetSpeed:
    """The faster of two short greedy target-only runs, each on a prompt not seen before, after a tiny warm-up: one
    token a piece."""
    _reference_run(target, SPEED_PROMPTS[0], WARMUP_TOKENS, step)
    runs = [_reference_run(target, prompt, SPEED_TOKENS, step) for prompt in SPEED_PROMPTS[1:]]
    stats = max(runs, key=lambda s: s.decode_tokens_per_s or 0.0)
    return TargetSpeed(stats.tokens_per_s, stats.decode_tokens_per_s or 0.0, stats.first_token_s or 0.0,
                       stats.new_tokens,
                       f"the faster of {len(runs)} runs of {stats.new_tokens} greedy tokens with the target-only "
                       f"reference decoder, each on a prompt not seen before ({stats.tokens_per_s:.1f} tok/s end to "
                       "end, prefill counted)")


def _reference_run(target: LoadedModel, prompt: str, tokens: int, step: Callable):
    ids = encode_chat(target.tokenizer, [{"role": "user", "content": prompt}], target.context_window)
    sampling = SamplingConfig(temperature=0.0, max_new_tokens=tokens, stop_on_eos=False)
    events = start_reference(target, ids, sampling)
    last = None
    while (event := step(lambda: next(events, None))) is not None:
        last = event
    return last.stats


def measure_pair(target: LoadedModel, draft: LoadedModel, step: Callable,
                 watch: CpuWatch | None = None) -> LoadChecks:
    """Every load-time figure of the pair, one ``step`` a piece, and whether the machine was quiet meanwhile."""
    watch = (watch or CpuWatch()).start()
    costs, spread = measure_step_costs(lambda: runner_for(target), lambda: runner_for(draft), step=step,
                                       busy=lambda: others_busy(watch.others_share()))
    identity = check_identity(target, step)
    speed = target_speed(target, step)
    return LoadChecks(costs, identity, speed, time.strftime("%Y-%m-%d %H:%M"),
                      busy=busy_reason(spread, watch.others_share()))


class Measurer:
    """Measures the loaded pair on its own thread and hands each result to ``install`` (the pair slot), again after a
    busy one until a quiet one comes. One measurement at a time: a new pair stops the previous pair's, and so does
    the slot's end (``install`` is held weakly: a dropped engine's measurement gives up at its next piece)."""

    def __init__(self, lock: ModelLock, store: MeasuredStore,
                 install: Callable[[tuple[LoadedModel, LoadedModel], LoadChecks], bool],
                 measure: Callable[..., LoadChecks] = measure_pair, idle_s: float = IDLE_S):
        self.lock, self.store, self.measure, self.idle_s = lock, store, measure, idle_s
        self._install = weakref.WeakMethod(install) if hasattr(install, "__self__") else (lambda: install)
        self._stop = threading.Event()
        self._done = threading.Event()
        self._done.set()

    def start(self, models: tuple[LoadedModel, LoadedModel]) -> None:
        """Measure ``models`` beside serving, on a thread of its own."""
        self._stop.set()
        self._stop, self._done = threading.Event(), threading.Event()
        threading.Thread(target=self._run, args=(models, self._stop, self._done, True), daemon=True,
                         name="speclens-measure").start()

    def now(self, models: tuple[LoadedModel, LoadedModel]) -> None:
        """Measure ``models`` in this thread, once (a test's or a benchmark's pair: kept if quiet, not retried)."""
        self._stop.set()
        self._stop, self._done = threading.Event(), threading.Event()
        self._run(models, self._stop, self._done, False)

    def stop(self) -> None:
        """No measurement for the loaded pair (its figures were kept): the current one, if any, gives up."""
        self._stop.set()
        self._done = threading.Event()
        self._done.set()

    def beside(self, work: Callable[[], object], name: str) -> None:
        """``work`` (a switch the figures chose: fastest's settings) on a thread of its own, waited for as a
        measurement is; a measurement it starts is waited for next."""
        done = self._done = threading.Event()

        def run():
            try:
                work()
            finally:
                done.set()
        threading.Thread(target=run, daemon=True, name=name).start()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the current measurement has a result installed (quiet or busy), and a switch it chose (with
        the measurement that switch started) has run; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = self._done
            if not done.wait(None if deadline is None else max(0.0, deadline - time.monotonic())):
                return False
            if done is self._done:  # nothing began meanwhile
                return True

    def _run(self, models, stop: threading.Event, done: threading.Event, retry: bool) -> None:
        step = idle_step(self.lock, models, self.idle_s, stop, alive=lambda: self._install() is not None)
        delay = RETRY_S
        try:
            while not stop.is_set():  # each attempt on a thread of its own, not this one, which waits between them
                checks = run_apart(lambda: self.measure(*models, step))
                install = self._install()
                if install is None or not install(models, checks):
                    return
                done.set()
                if not checks.busy:
                    self.store.put(models, checks)
                    return
                log.warning("load-time figures flagged: %s%s", checks.busy,
                            f"; measuring again in {delay:.0f} s" if retry else "")
                if not retry or stop.wait(delay):
                    return
                delay = min(delay * 2, RETRY_MOST_S)
        except Superseded:
            return
        except Exception:  # a failed measurement leaves the pair serving target-only steps; said in the log
            log.exception("the load-time measurement failed")
        finally:
            done.set()
