"""A streaming chat answer's frames: when the page redraws it, and what each frame sends over the answer's own stream
(app/api/live_stream.py; the page's side is assets/live.js)."""
from __future__ import annotations

import time

from app.api.live_stream import LiveStream
from app.turn import Turn
from app.views.markdown import render_markdown
from app.views.render import esc, render_answer, render_cache_note, render_tokens

FRAME_S = 0.2  # a streaming answer redraws at most this often (5 frames a second; docs/bench.md has the cost)
PANEL_S = 1.0  # the statistics panel beside it at most this often (its figures settle over steps, not tokens)


class Frames:
    """When a streaming answer redraws: at most once every ``period`` (``FRAME_S``; the events between are drawn
    together in the next frame, since the engine runs ahead on its own worker), after a step (a StatsEvent). A
    redraw costs the server a render and the browser a layout on the cores the model runs on: drawing every token
    would slow the answer down."""

    def __init__(self, period: float = FRAME_S, clock=time.monotonic):
        self.period, self.clock = period, clock
        self.last = -float("inf")

    def due(self, event_type: str) -> bool:
        if event_type != "stats" or self.clock() - self.last < self.period:
            return False
        self.last = self.clock()
        return True


class LiveDraw:
    """What the answer's stream gets at each frame: the spans of the tokens since the last frame (appended), the
    Markdown view of the whole answer so far, the cache note and the statistics panel (each replaced, and only when
    it changed)."""

    def __init__(self, stream: LiveStream):
        self.stream, self.sent = stream, 0
        self.shown: dict[str, str | None] = {"md": None, "note": "", "panel": None}

    def frame(self, turn: Turn, panel: str | None = None) -> None:
        new = turn.tokens[self.sent:]
        md = render_markdown(turn.tokens) if new or self.shown["md"] is None else self.shown["md"]
        now = {"md": md, "note": render_cache_note(turn.cache), "panel": panel or self.shown["panel"]}
        latest = {k: v for k, v in now.items() if v is not None and v != self.shown[k]}
        self.sent, self.shown = len(turn.tokens), now
        if new or latest:
            self.stream.push(render_tokens(new), **latest)


def live_start(question: str, url: str) -> str:
    """The live box as the answer starts: the question, and an empty answer that its stream (``url``) fills in."""
    empty = render_answer([], streaming=True, markdown_html="")
    return live_box(question, f'<div class="live-answer" data-live-stream="{esc(url)}"><div class="live-note"></div>'
                           f"{empty}</div>")


def live_box(question: str, answer: str) -> str:
    """The live box: the question, and the answer (streaming, or the finished one)."""
    return f'<div class="live-question">{question}</div>{answer}'
