"""app/tabs/chat.py: the chat's handlers on a fake engine: an answer streamed, an error shown, Stop, a closed tab."""
from dataclasses import replace
from types import SimpleNamespace

import pytest

from app.baseline import BaselineStore
from app.context import AppContext
from app.settings import UISettings
from app.tabs.chat import ChatTab, join_answer, make_handlers, stream_answer
from app.tabs.controls import CacheControls, Controls, DecodingControls
from engine.config import CacheConfig
from engine.events import CacheEvent
from tests.helpers.fakes import IMG, SCRIPT, FakeEngine, assert_inert, done, named, stats, tok

TAB = named(ChatTab)
CONTROLS = Controls(named(DecodingControls), named(CacheControls))


def test_stream_answer_renders_tokens_stats_and_history(tmp_path):
    events = [CacheEvent("miss"), tok(SCRIPT), tok("!", "corrected", rejected_token_id=2, rejected_text=IMG),
              stats(), done()]
    ctx = AppContext(FakeEngine(events), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    last = join_answer(TAB, updates[-1]["pending"])
    shown = last["chatbot"][-1]["content"]
    assert "tok-accepted" in shown and "tok-corrected" in shown
    assert_inert(shown)
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
    from app.tabs.chat import FRAME_S, Frames

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
    """200 steps that come at once (a fast engine, a cached replay): a handful of updates, not 200; the states the
    next turn reads are written once, with the whole answer."""
    from app.tabs import chat

    monkeypatch.setattr(chat.time, "monotonic", lambda: 1000.0)  # the whole answer within one frame
    events = [CacheEvent("miss")]
    for i in range(200):
        events += [tok(f"w{i} "), stats()]
    ctx = AppContext(FakeEngine([*events, done()]), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    drawn = [u for u in updates if "live" in u]  # the streaming answer's box: the start, a frame, the end
    assert len(drawn) <= 3 and "w199" in updates[-1]["live"]  # the last frame holds the whole answer
    assert sum("pending" in u for u in updates) == 1 and "pending" in updates[-1]
    joined = join_answer(TAB, updates[-1]["pending"])
    assert "w199" in joined["chatbot"][-1]["content"] and joined["live"] == ""  # then it joins the chat


def test_the_panel_redraws_at_its_own_slower_pace_and_its_last_frame_is_the_answers(tmp_path, monkeypatch):
    """A step every frame for 4 seconds: the live box redraws at each (5 a second), the statistics panel once a
    second (PANEL_S), and the last update holds the finished panel."""
    from app.tabs import chat

    now = [1000.0]
    monkeypatch.setattr(chat, "Frames", lambda period=chat.FRAME_S, real=chat.Frames: real(period, lambda: now[0]))

    def steps():  # the engine: a step per frame, the clock moving on between them
        yield CacheEvent("miss")
        for i in range(20):
            yield tok(f"w{i} ")
            yield stats()
            now[0] += chat.FRAME_S
        yield done()

    ctx = AppContext(FakeEngine(steps()), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
    live, panel = sum("live" in u for u in updates), sum("stats" in u for u in updates)
    assert live >= 20 and panel <= 6
    assert "done (eos)" in updates[-1]["stats"]


def test_a_frame_never_carries_the_chat_and_its_size_does_not_grow_with_the_conversation(tmp_path):
    """The streaming event touches the live box and the panel only: the chat, its states and the plots are written
    once, by the join after the answer; a frame's payload is the same for the first answer and the fiftieth."""
    events = [CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]
    sizes = []
    for earlier in (0, 50):
        shown = [{"role": r, "content": f"<div>message {i} " + "x" * 500 + "</div>"}
                 for i in range(earlier) for r in ("user", "assistant")]
        history = [{"role": m["role"], "content": "x" * 500} for m in shown]
        ctx = AppContext(FakeEngine(events), BaselineStore(tmp_path / "b.json"))
        updates = list(stream_answer(ctx, TAB, history=history, shown=shown, prompt="hi", settings=UISettings(),
                                     session="s1"))
        assert all(set(u) <= {"live", "stats", "msg", "error_box", "pending"} for u in updates)
        sizes.append([len(u.get("live", "")) + len(u.get("stats", "")) for u in updates])
        assert len(join_answer(TAB, updates[-1]["pending"])["chatbot"]) == 2 * earlier + 2
    assert sizes[0] == sizes[1]
