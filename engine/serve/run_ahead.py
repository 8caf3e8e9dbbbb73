"""A generation on its own worker thread: decoding never waits for delivery.

llama-server's slots and vLLM's output queues decouple the decode from whoever reads it; so does this. The
worker advances the decode (each step under the model lock, engine/serve/model_lock.py) and puts every event on
an unbounded queue; the reader takes them at its own pace. A slow reader (a browser that redraws, a client on a
slow link) costs the decode nothing, and a reader that leaves (the generator closed: a cancelled job, a gone
client) sets the cancel flag, so the decode stops at its next step and ends its own way (its DoneEvent, the
cache's bookkeeping) with nobody reading. An error in the decode reaches the reader at the point it happened.
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import closing
from typing import TypeVar

T = TypeVar("T")

_END = object()  # the decode ended: nothing more comes


class _Failed:
    """The decode raised: the reader raises the same error when it reaches this point."""

    def __init__(self, error: BaseException):
        self.error = error


def _produce(events: Iterator[T], out: queue.SimpleQueue) -> None:
    try:
        with closing(events):
            for item in events:
                out.put(item)
    except BaseException as err:  # handed to the reader, which raises it in its own thread
        out.put(_Failed(err))
    else:
        out.put(_END)


def run_ahead(events: Iterator[T], cancel: threading.Event, name: str = "speclens-decode") -> Iterator[T]:
    """``events`` computed on a worker thread that starts when this generator is first advanced, read here in
    order. A reader that leaves before the end (this generator closed, or an error while reading) sets ``cancel``;
    one that reads to the end leaves it as it was (a caller may run its next generation on the same flag)."""
    out: queue.SimpleQueue = queue.SimpleQueue()
    threading.Thread(target=_produce, args=(events, out), name=name, daemon=True).start()
    ended = False
    try:
        while True:
            item = out.get()
            if item is _END or isinstance(item, _Failed):
                ended = True
                if item is _END:
                    return
                raise item.error
            yield item
    finally:
        if not ended:  # the reader left: the decode stops at its next step
            cancel.set()
