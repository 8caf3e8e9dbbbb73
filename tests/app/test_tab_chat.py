"""app/tabs/chat.py: the chat's handlers on a fake engine: an answer streamed, an error shown, Stop, a closed tab."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from app.api.live_stream import LiveStreams
from app.baseline import BaselineStore
from app.context import AppContext
from app.live import FRAME_S, Frames
from app.settings import UISettings
from app.tabs.chat import ChatTab, join_answer, make_handlers, stream_answer
from app.tabs.controls import CacheControls, Controls, DecodingControls
from app.views.render import render_tokens
from engine.config import CacheConfig
from engine.events import CacheEvent
from tests.helpers.fakes import IMG, SCRIPT, FakeEngine, assert_inert, done, named, stats, tok

TAB = named(ChatTab)
CONTROLS = Controls(named(DecodingControls), named(CacheControls))


class CountingStreams(LiveStreams):
    """The app's streams, each push counted: the frames an answer sends its live box."""

    def open(self):
        stream = super().open()
        stream.pushes = []
        push = stream.push
        stream.push = lambda raw="", **latest: (stream.pushes.append((raw, latest)), push(raw, **latest))[1]
        self.last = stream
        return stream


def test_stream_answer_renders_tokens_stats_and_history(tmp_path):
    events = [CacheEvent("miss"), tok(SCRIPT), tok("!", "corrected", rejected_token_id=2, rejected_text=IMG),
              stats(), done()]
    ctx = AppContext(FakeEngine(events), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    last = join_answer(TAB, updates[-1]["pending"])
    shown = last["chat"]
    assert "tok-accepted" in shown and "tok-corrected" in shown
    assert_inert(shown)
    assert 'data-text="ab"' in shown  # the copy button copies the answer's plain text, not its HTML
    assert last["history"][-1] == {"role": "assistant", "content": "ab"}
    assert "done (eos)" in updates[-1]["stats"] and last["live"] == "" and last["pending"] is None
    assert ctx.engine.calls[0]["cache"] == CacheConfig("verify", UISettings().cache_threshold)


def test_an_answer_reads_the_pair_once_and_its_meter_and_trace_are_of_that_pair(tmp_path):
    """The pair is read once per answer: the meter's target-only speed and the trace's pair are that one value, though
    the engine's figures change while the answer streams (here: they come in after the first read)."""
    class Counting(FakeEngine):
        reads = 0

        def info(self):
            Counting.reads += 1
            pair = FakeEngine.info(self)
            return pair if Counting.reads == 1 else replace(pair, target="another", target_speed=None)

    ctx = AppContext(Counting([CacheEvent("miss"), tok("a"), stats(), done()]), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    assert Counting.reads == 1
    assert updates[-1]["pending"]["trace"]["pair"]["target"] == "t"
    assert "10.0 tok/s" in updates[-1]["stats"]  # the meter divides by the speed that pair measured


def test_stream_answer_shows_engine_errors_and_changes_nothing(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    with pytest.warns(UserWarning):
        updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="   ", settings=UISettings(),
                                     session="s1"))
    assert len(updates) == 1 and "the message is empty" in updates[0]["error_box"]
    assert "pending" not in updates[0] and join_answer(TAB, None) == {TAB.pending: None}  # nothing joins the chat


def test_stop_decides_from_the_running_generation_not_the_html(tmp_path):
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), done()]), BaselineStore(tmp_path / "b.json"))
    stop, request = make_handlers(ctx, TAB, CONTROLS)["stop"], SimpleNamespace(session_hash="s1")
    assert "Nothing is running" in stop(request)
    stream = stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    next(stream)
    assert "Stopping at the next step" in stop(request) and ctx.engine.calls[0]["cancel"].is_set()
    list(stream)
    assert "Nothing is running" in stop(request)
    with pytest.warns(UserWarning):  # an answer that never started leaves nothing to stop
        list(stream_answer(ctx, TAB, history=[], shown=[], prompt=" ", settings=UISettings(), session="s1"))
    assert "Nothing is running" in stop(request)


def test_closing_the_chat_stream_cancels_the_engine(tmp_path):
    """Stop (cancels=) and a closed tab close the handler generator; the engine's flag must be set then."""
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]),
                     BaselineStore(tmp_path / "b.json"))
    stream = stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    next(stream), next(stream)
    flag = ctx.engine.calls[0]["cancel"]
    assert not flag.is_set()
    stream.close()
    assert flag.is_set()


def test_frames_coalesce_a_burst_of_steps_into_one_redraw():
    now = [0.0]
    frames = Frames(clock=lambda: now[0])
    assert not frames.due("token")  # tokens never draw alone: the step's StatsEvent does
    assert frames.due("stats")
    drawn = 0
    for _ in range(50):  # a burst: 50 steps within one frame
        now[0] += FRAME_S / 100
        drawn += frames.due("stats")
    assert drawn == 0
    now[0] += FRAME_S
    assert frames.due("stats")


def test_a_fast_answer_is_drawn_in_few_frames_and_the_last_shows_every_token(tmp_path, monkeypatch):
    """200 steps that come at once (a fast engine, a cached replay): a frame for the first step and one for the end,
    not 200; Gradio writes the box at the start and the end; the states the next turn reads are written once, with
    the whole answer."""
    from app.tabs import chat

    monkeypatch.setattr(chat, "Frames", lambda period=FRAME_S, real=Frames: real(period, lambda: 1000.0))
    events = [CacheEvent("miss")]
    for i in range(200):
        events += [tok(f"w{i} "), stats()]
    ctx = AppContext(FakeEngine([*events, done()]), BaselineStore(tmp_path / "b.json"), live=CountingStreams())
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    assert len(ctx.live.last.pushes) == 2 and "w199" in ctx.live.last.pushes[-1][0]
    drawn = [u for u in updates if "live" in u]
    assert len(drawn) == 2 and "w199" in updates[-1]["live"]  # the last write holds the whole answer
    assert sum("pending" in u for u in updates) == 1 and "pending" in updates[-1]
    joined = join_answer(TAB, updates[-1]["pending"])
    assert "w199" in joined["chat"] and joined["live"] == ""  # then it joins the chat


def test_the_panel_redraws_at_its_own_slower_pace_and_its_last_frame_is_the_answers(tmp_path, monkeypatch):
    """A step every frame for 4 seconds: the live box gets a frame at each (5 a second) over its own stream, not
    through Gradio, the statistics panel one update a second (PANEL_S), and the last update holds the finished panel
    and the whole answer."""
    from app.tabs import chat

    now = [1000.0]
    monkeypatch.setattr(chat, "Frames", lambda period=FRAME_S, real=Frames: real(period, lambda: now[0]))

    def steps():  # the engine: a step per frame, the clock moving on between them
        yield CacheEvent("miss")
        for i in range(20):
            yield tok(f"w{i} ")
            yield stats()
            now[0] += FRAME_S
        yield done()

    ctx = AppContext(FakeEngine(steps()), BaselineStore(tmp_path / "b.json"), live=CountingStreams())
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    live, panel = sum("live" in u for u in updates), sum("stats" in u for u in updates)
    # nobody read the stream (a script on Gradio's API): the panel went through Gradio, the box only at start and end
    assert len(ctx.live.last.pushes) == 20 and live == 2 and 3 <= panel <= 6
    assert "done (eos)" in updates[-1]["stats"] and "w19" in updates[-1]["live"]


def test_the_live_stream_carries_each_token_once_and_the_markdown_and_note_when_they_change(tmp_path, monkeypatch):
    """What the page's script reads (assets/live.js): the first Gradio write names the stream; its frames' spans,
    joined, are every token streamed, each once, in order; the Markdown view and the cache note come only when they
    changed; the stream ends with the answer, and only its first reader can claim it."""
    from app.tabs import chat

    now = [1000.0]
    monkeypatch.setattr(chat, "Frames", lambda period=FRAME_S, real=Frames: real(period, lambda: now[0]))

    def steps():
        yield CacheEvent("miss")
        for word in ("# Title", "\n\nSome ", "**bold**", " text"):
            yield tok(word)
            yield stats()
            now[0] += FRAME_S
        yield stats()  # a step with no new token: nothing to send
        now[0] += FRAME_S
        yield done()

    ctx = AppContext(FakeEngine(steps()), BaselineStore(tmp_path / "b.json"), live=CountingStreams())
    stream = stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    first = next(stream)["live"]
    url = ctx.live.last.url
    assert f'data-live-stream="{url}"' in first and "tokstream streaming" in first
    reader = ctx.live.claim(url.rsplit("/", 1)[1])
    assert reader is ctx.live.last and ctx.live.claim(reader.id) is None  # one reader
    rest = list(stream)
    pushes = reader.pushes
    assert len(pushes) == 5 and "".join(raw for raw, _ in pushes) == render_tokens(
        [tok("# Title"), tok("\n\nSome "), tok("**bold**"), tok(" text")])
    # a miss has no note: none is sent; the panel comes once a second (PANEL_S), with the stream's frames, and the
    # last frame (the answer done, no new token) is the finished panel; a step with nothing new sends nothing
    assert [set(latest) for _, latest in pushes] == [{"md", "panel"}, {"md"}, {"md"}, {"md"}, {"panel"}]
    assert "<h1>" in pushes[0][1]["md"] and "<strong>" in pushes[3][1]["md"] and "streaming" in pushes[0][1]["panel"]
    assert pushes[4][0] == "" and "done (eos)" in pushes[4][1]["panel"]
    merged = reader.take(0)  # the reader took nothing while it streamed: the frames come merged, then the end
    assert merged == {"raw": "".join(raw for raw, _ in pushes), "md": pushes[3][1]["md"],
                      "panel": pushes[4][1]["panel"]}
    assert reader.take(0) is None and "<strong>" in rest[-1]["live"] and "data-live-stream" not in rest[-1]["live"]
    assert len(rest) == 1 and "done (eos)" in rest[0]["stats"]  # with a reader, Gradio writes only the end


def test_a_page_that_stops_reading_its_answer_stops_the_answer(tmp_path):
    """Gradio closes a handler only where it yields, and a read answer yields only at its start and end: a reader
    that leaves (a closed tab: the route marks the stream abandoned) raises the engine's cancel flag."""
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]),
                     BaselineStore(tmp_path / "b.json"), live=CountingStreams())
    stream = stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    next(stream)
    ctx.live.claim(ctx.live.last.id).abandoned = True
    list(stream)
    assert ctx.engine.calls[0]["cancel"].is_set()


def test_a_frame_never_carries_the_chat_and_its_size_does_not_grow_with_the_conversation(tmp_path):
    """The streaming event touches the live box and the panel only: the chat, its states and the plots are written
    once, by the join after the answer; a frame's payload is the same for the first answer and the fiftieth."""
    events = [CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]
    sizes, writes = [], []
    for earlier in (0, 50):
        shown = [{"role": r, "content": f"<div>message {i} " + "x" * 500 + "</div>"}
                 for i in range(earlier) for r in ("user", "assistant")]
        history = [{"role": m["role"], "content": "x" * 500} for m in shown]
        ctx = AppContext(FakeEngine(events), BaselineStore(tmp_path / "b.json"))
        updates = list(stream_answer(ctx, TAB, history=history, shown=shown, prompt="hi", settings=UISettings(),
                                     session="s1"))
        assert all(set(u) <= {"live", "stats", "msg", "error_box", "pending"} for u in updates)
        sizes.append([len(u.get("live", "")) + len(u.get("stats", "")) for u in updates])
        joined = join_answer(TAB, updates[-1]["pending"])
        assert len(joined["shown"]) == 2 * earlier + 2 and f'data-keep="{2 * earlier}"' in joined["chat"]
        writes.append(len(joined["chat"]) - len(str(2 * earlier)))  # data-keep="0" or "100"
    assert sizes[0] == sizes[1] and writes[0] == writes[1]  # the join writes the new pair only, not the chat
