"""app/api/queue_pace.py: the served app's Gradio queue polls at the paced periods, not every millisecond."""
import asyncio
import time
import types

import gradio.queueing

from app.api.queue_pace import JOB_POLL_S, PACED, PROGRESS_POLL_S, pace_queue


def test_gradio_s_queue_still_has_the_paced_periods():
    """The attributes paced are Gradio's own (a fresh queue's numbers): a Gradio that renamed them fails here, not
    silently in the app."""
    import gradio as gr

    queue = gr.Blocks()._queue
    assert all(isinstance(getattr(queue, name), (int, float)) for name in PACED)
    pace_queue(queue)
    assert (queue.sleep_when_free, queue.progress_update_sleep_when_free) == (JOB_POLL_S, PROGRESS_POLL_S)


def test_the_served_queue_wakes_at_the_paced_periods(monkeypatch):
    """The app as served (create_server), idle for a second: every sleep of the queue's loops is at least the job
    period (Gradio's own is 1 ms, and 10 ms for progress); and the loops do run, so the pace is what they sleep."""
    from app.api.openai_routes import create_server
    from app.context import AppContext
    from app.ui import build_demo, launch_kwargs
    from tests.helpers.fakes import FakeEngine
    from tests.helpers.server import serving

    slept = []

    async def sleep(delay, *args, **kwargs):
        slept.append(delay)
        return await asyncio.sleep(delay, *args, **kwargs)

    monkeypatch.setattr(gradio.queueing, "asyncio", types.SimpleNamespace(**{**vars(asyncio), "sleep": sleep}))
    ctx = AppContext(FakeEngine([], cache=False))
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=1)
    with serving(create_server(ctx, demo, None, **launch_kwargs())):
        slept.clear()
        time.sleep(1.0)
    assert slept, "the queue's loops did not run"
    assert min(slept) >= JOB_POLL_S, sorted(slept)[:5]
    assert PROGRESS_POLL_S in slept
