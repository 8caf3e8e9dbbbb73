"""app/tabs/chat.py: the chat's handlers on a fake engine: an answer streamed, an error shown, Stop, a closed tab."""
from types import SimpleNamespace

import pytest

from app.baseline import BaselineStore
from app.context import AppContext
from app.settings import UISettings
from app.tabs.chat import ChatTab, make_handlers, stream_answer
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
    last = updates[-1]
    shown = last["chatbot"][-1]["content"]
    assert "tok-accepted" in shown and "tok-corrected" in shown
    assert_inert(shown)
    assert last["history"][-1] == {"role": "assistant", "content": "ab"}
    assert "done (eos)" in last["stats"]
    assert ctx.engine.calls[0]["cache"] == CacheConfig("verify", UISettings().cache_threshold)


def test_stream_answer_shows_engine_errors_and_changes_nothing(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    with pytest.warns(UserWarning):
        updates = list(stream_answer(ctx, TAB, history=[], shown=[], prompt="   ", settings=UISettings(),
                                     session="s1"))
    assert len(updates) == 1 and "the message is empty" in updates[0]["error_box"]
    assert "chatbot" not in updates[0] and "history" not in updates[0]


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
