"""Decoding never waits for delivery (engine/serve/run_ahead.py): a generation runs on its own worker at the engine's
pace; a reader that stalls does not stall it, a reader that leaves cancels it, and two generations take turns on
the model lock. No wall-clock time is asserted: the tests wait on events, with timeouts only as failure guards."""
from __future__ import annotations

import contextvars
import threading

import pytest

from engine.chat_engine import ChatEngine
from engine.config import SamplingConfig, SpecConfig
from engine.events import final_done
from engine.serve.model_lock import FairLock, ModelLock
from engine.serve.run_ahead import run_ahead
from tests.helpers.tiny import tiny_pair

GUARD_S = 120  # a failure guard, never a measured time

LONG = SamplingConfig(max_new_tokens=40, stop_on_eos=False)
SPEC = SpecConfig(k=3)


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def _decode_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "speclens-decode"]


def test_a_stalled_reader_does_not_stall_the_source():
    produced, cancel = threading.Event(), threading.Event()

    def source():
        yield from range(1000)
        produced.set()

    items = run_ahead(source(), cancel)
    assert next(items) == 0
    assert produced.wait(GUARD_S), "the source waited for its reader"
    assert list(items) == list(range(1, 1000))
    assert not cancel.is_set()  # read to its end: the flag is the caller's to reuse


def test_a_reader_that_leaves_sets_cancel_and_the_source_ends_its_own_way():
    cancel, ended = threading.Event(), threading.Event()

    def source():
        try:
            i = 0
            while not cancel.is_set():  # a decode: stops at its next step once cancel is set
                yield i
                i += 1
            yield "done"
        finally:
            ended.set()

    items = run_ahead(source(), cancel)
    assert next(items) == 0
    items.close()
    assert cancel.is_set() and ended.wait(GUARD_S)


def test_an_error_in_the_source_reaches_the_reader_where_it_happened():
    def source():
        yield 1
        raise ValueError("bad step")

    items = run_ahead(source(), threading.Event())
    assert next(items) == 1
    with pytest.raises(ValueError, match="bad step"):
        next(items)


def test_the_fair_lock_hands_over_to_the_waiter_before_the_releaser_takes_it_again():
    lock, order, queued = FairLock(), [], threading.Event()
    lock.acquire()

    def waiter():
        queued.set()
        lock.acquire()
        order.append("waiter")
        lock.release()

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert queued.wait(GUARD_S)
    while not lock._waiting:  # the waiter's ticket is in the queue
        threading.Event().wait(0.001)
    lock.release()
    lock.acquire()  # the releaser asks again at once: it queues behind the waiter
    order.append("releaser")
    lock.release()
    thread.join(GUARD_S)
    assert order == ["waiter", "releaser"]


def test_a_generation_finishes_while_its_reader_stalls():
    """The reader takes the first event and stops reading: the decode still runs to its end on its worker."""
    engine = ChatEngine()
    engine.use_models(*tiny_pair(2))
    expected = final_done(engine.generate(ask("stall"), LONG, SPEC))
    before = set(_decode_threads())
    events = engine.generate(ask("stall"), LONG, SPEC)
    first = next(events)
    workers = [t for t in _decode_threads() if t not in before]
    assert len(workers) == 1
    workers[0].join(GUARD_S)
    assert not workers[0].is_alive(), "the decode waited for its reader"
    done = final_done([first, *events])
    assert done.token_ids == expected.token_ids and done.finish_reason == "length"


def test_a_gone_reader_cancels_the_generation_at_its_next_step():
    """The model lock is held while the reader leaves, so no step can run between: the decode's next step sees
    the cancel and ends the answer there, with no reader left."""
    engine = ChatEngine()
    engine.use_models(*tiny_pair(2))
    cancel = threading.Event()
    events = engine.generate(ask("leave"), LONG, SPEC, cancel=cancel)
    with engine.lock.over((), "the test"):
        assert next(events).type == "cache"  # yielded before any step, without the lock
        before = set(_decode_threads())
        events.close()
        assert cancel.is_set()
    for worker in before:
        worker.join(GUARD_S)
        assert not worker.is_alive()


def test_a_cancel_set_before_a_step_ends_the_answer_before_it():
    engine = ChatEngine()
    engine.use_models(*tiny_pair(2))
    cancel = threading.Event()
    events = engine.generate(ask("cancel"), LONG, SPEC, cancel=cancel)
    with engine.lock.over((), "the test"):
        assert next(events).type == "cache"
        cancel.set()
    done = final_done(events)
    assert done.finish_reason == "cancelled" and done.token_ids == () and done.stats.acceptance.steps == 0


class _RecordingLock(FairLock):
    """The engine's lock, noting which thread took it each time."""

    def __init__(self):
        super().__init__()
        self.takers: list[int] = []

    def acquire(self) -> None:
        super().acquire()
        self.takers.append(threading.get_ident())


def test_two_generations_at_once_take_turns_step_by_step():
    """Two answers started together: their decodes take the model lock in turns (neither runs to its end before
    the other's first step), and each is the answer it gives alone."""
    engine = ChatEngine()
    engine.use_models(*tiny_pair(4))
    alone = {p: final_done(engine.generate(ask(p), LONG, SPEC)).token_ids for p in ("one", "two")}
    recording = engine.lock._lock = _RecordingLock()
    results = {}
    start = threading.Barrier(2, timeout=GUARD_S)

    def chat(prompt: str) -> None:
        start.wait()
        results[prompt] = final_done(engine.generate(ask(prompt), LONG, SPEC)).token_ids

    threads = [threading.Thread(target=chat, args=(p,), daemon=True) for p in ("one", "two")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(GUARD_S)
    assert results == alone
    takers = recording.takers
    assert len(set(takers)) == 2
    first_end = min(len(takers) - takers[::-1].index(who) for who in set(takers))  # the first decode's last turn
    assert set(takers[:first_end - 1]) == set(takers), "one answer ran to its end before the other's first step"


def test_model_work_runs_on_a_thread_that_ends_with_it_never_on_the_callers():
    """llama.cpp's and torch's kernels run an OpenMP team per calling thread, living as long as that thread; with
    more of them than cores, libgomp stops spinning at llama.cpp's per-op barriers (engine/serve/model_lock.py).
    So ``ModelLock.run`` (an explanation, the doctor, a cached answer's check) runs its work on a thread of its own:
    the caller's context variables go with it, its error comes back, and the thread has ended when it returns."""
    lock, seen = ModelLock(), []
    asked = contextvars.ContextVar("asked")
    asked.set("the caller's")

    def work():
        seen.append(threading.current_thread())
        return asked.get()
    assert lock.run([], "while testing", work) == "the caller's"
    assert seen[0] is not threading.current_thread() and not seen[0].is_alive()

    def fails():
        raise ValueError("from the work")
    with pytest.raises(ValueError, match="from the work"):
        lock.run([], "while testing", fails)
    assert lock.run([], "while testing", lambda: "the lock was let go of") == "the lock was let go of"
