"""Gradio's queue, paced for a machine the model decodes on.

Gradio 6.31's queue looks for a job to start every millisecond while it has a free worker, and for progress to send
every 10 ms while a job runs (``gradio.queueing.Queue``: ``sleep_when_free`` 0.001 s,
``progress_update_sleep_when_free`` 0.01 s off Windows): an idle app took 2.3% of a core on 2 Zen 5 cores, nearly all
of it those wake-ups, and they go on while an answer decodes, on the cores llama.cpp's threads wait on each other
across. Paced, a job starts within ``JOB_POLL_S`` of its request and a progress bar moves ``1 / PROGRESS_POLL_S`` times
a second; the idle app takes 0.5% (docs/bench.md).
"""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

JOB_POLL_S = 0.01  # how often a free queue looks for a job: a chat's answer starts within this of its request
PROGRESS_POLL_S = 0.1  # how often a running job's progress is sent: a progress bar's redraws, 10 a second
PACED = {"sleep_when_free": JOB_POLL_S, "progress_update_sleep_when_free": PROGRESS_POLL_S}


def pace_queue(queue) -> None:
    """Space the polling loops of a Blocks' queue (``demo._queue``) to ``PACED``'s periods. A Gradio that no longer has
    these attributes is left as it is, with a warning (the test of this module fails on it)."""
    for name, period in PACED.items():
        if not isinstance(getattr(queue, name, None), (int, float)):
            log.warning("Gradio's queue has no %s any more: its polling is left unpaced", name)
            continue
        setattr(queue, name, max(getattr(queue, name), period))
