"""The streaming chat answer's own stream: its frames reach the page over a route of their own, not through Gradio.

Gradio writes the live box twice per answer (its start, with the URL of this stream, and its end, the whole answer);
between the two, every frame is a line of JSON read by the live box's script (assets/live.js), which appends the new
tokens' spans and replaces the Markdown view. A Gradio message per frame cost the page its status tracker, the
output's full value rebuilt from diffs and the component's morph of both views, and the server a diff of the whole
box: on 2 cores that CPU is taken from the model's threads (docs/bench.md, "The answer's own stream").

- A stream keeps what its reader has not taken yet (the spans since, the latest of everything else), not every
  frame: a slow reader gets the frames merged, a missing one (a script client of Gradio's API) costs one answer's
  spans, and the writer never waits.
- ``GET /speclens/live/ID`` gives the stream to its first reader only (``LiveStreams.claim``); the id is 128 random
  bits, handed only to the page that started the answer (behind Gradio's login when the app has an API key), and it
  is gone once the answer ends.
- A reader that leaves before the end (a closed tab) marks the stream ``abandoned``, and the answer stops: with no
  Gradio message during the answer, Gradio itself could close the handler only at its end.
"""
from __future__ import annotations

import json
import secrets
import threading
from collections import OrderedDict

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool
from starlette.responses import PlainTextResponse, StreamingResponse

ROUTE = "speclens/live/"  # relative: the page resolves it against its own URL, wherever the app is mounted
MAX_OPEN = 256  # streams not yet read or ended (an answer ends its own: this bounds the ones nobody read)
WAIT_S = 1.0  # how long a reader waits for a frame before it looks again


class LiveStream:
    """One answer's frames on their way to the page: ``push`` from the handler, ``take`` from the route."""

    def __init__(self, sid: str):
        self.id, self.url = sid, ROUTE + sid
        self._cond = threading.Condition()
        self._raw: list[str] = []
        self._latest: dict[str, str] = {}  # "md", "note", "panel": only the newest counts
        self._closed = False
        self.claimed = False  # a reader has it (the page that started the answer)
        self.abandoned = False  # its reader went away before the end (the tab closed): the answer should stop

    def push(self, raw: str = "", **latest: str) -> None:
        """New tokens' spans (appended by the page) and the newest ``md``, ``note`` and ``panel`` (replaced)."""
        with self._cond:
            if raw:
                self._raw.append(raw)
            self._latest.update(latest)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, timeout: float = WAIT_S) -> dict | None:
        """What came since the last take (``{}`` when nothing came within ``timeout``); None once it is closed and
        all of it was taken."""
        with self._cond:
            self._cond.wait_for(lambda: self._raw or self._latest or self._closed, timeout)
            if not (self._raw or self._latest):
                return None if self._closed else {}
            frame = {**self._latest, **({"raw": "".join(self._raw)} if self._raw else {})}
            self._raw, self._latest = [], {}
            return frame


class LiveStreams:
    """The streams of the answers under way, by id, until their reader claims them or they end."""

    def __init__(self, max_open: int = MAX_OPEN):
        self.max_open = max_open
        self._open: OrderedDict[str, LiveStream] = OrderedDict()
        self._lock = threading.Lock()

    def open(self) -> LiveStream:
        stream = LiveStream(secrets.token_urlsafe(16))
        with self._lock:
            self._open[stream.id] = stream
            while len(self._open) > self.max_open:
                self._open.popitem(last=False)[1].close()
        return stream

    def claim(self, sid: str) -> LiveStream | None:
        """The stream for its one reader; None for an unknown, ended or already claimed id."""
        with self._lock:
            stream = self._open.pop(sid, None)
        if stream is not None:
            stream.claimed = True
        return stream

    def end(self, stream: LiveStream) -> None:
        """The answer is done: its reader (if any) gets what is left, then the end; nobody can claim it any more."""
        stream.close()
        with self._lock:
            if self._open.get(stream.id) is stream:
                del self._open[stream.id]


async def frames_of(stream: LiveStream):
    """The stream as lines of JSON, until it ends. A blocking ``take`` runs on a worker thread, woken at least every
    ``WAIT_S``, so a reader that went away frees its thread soon after and marks the stream ``abandoned``."""
    ended = False
    try:
        while True:
            frame = await run_in_threadpool(stream.take)
            if frame is None:
                ended = True
                return
            if frame:
                yield json.dumps(frame, ensure_ascii=False) + "\n"
    finally:
        stream.abandoned = not ended


def add_live_route(app: FastAPI, streams: LiveStreams) -> FastAPI:
    @app.get("/" + ROUTE + "{sid}", include_in_schema=False)
    def live(sid: str):
        stream = streams.claim(sid)
        if stream is None:
            return PlainTextResponse("no such answer streaming (it ended, or another reader has it)", status_code=404)
        return StreamingResponse(frames_of(stream), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})
    return app
