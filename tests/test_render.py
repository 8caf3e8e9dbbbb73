"""The UI's pure parts on hand-made events: escaping, kind classes, legend, stats, plots data, handlers. No browser."""
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest

from app.baseline import BaselineStore, baseline_key, get_or_measure
from app.cache_panel import cache_summary_html, entries_frame
from app.chat import mark_stopped, stream_answer
from app.context import AppContext
from app.pair import pair_status_html
from app.race import race_summary
from app.render import (error_html, legend_html, render_answer, render_cache_note, render_token, render_user,
                        token_title)
from app.settings import UISettings, cache_options, sampling_config, spec_config
from app.stats_view import (acceptance_frame, format_stats, render_stats, speedup, speedup_frame,
                            theoretical_speedup)
from engine.costmodel import StepCosts
from app.turn import Turn, trace_document
from engine.errors import EmptyPromptError, InvalidSettingError
from engine.events import TOKEN_KINDS, CacheEvent, DoneEvent, StatsEvent, TokenEvent

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(1)">'


def tok(text="a", kind="accepted", **kw):
    base = dict(token_id=1, text=text, kind=kind, step=2, t=0.1, p_target=0.9, q_draft=0.8, draft_pos=0)
    return TokenEvent(**{**base, **kw})


def stats(**kw):
    base = dict(steps=4, new_tokens=12, proposed=16, accepted=8, elapsed_s=2.0, k=4, draft_s=0.4, verify_s=1.2,
                accepted_by_pos=(4, 2, 1, 1), proposed_by_pos=(4, 4, 4, 4))
    return StatsEvent(**{**base, **kw})


def assert_inert(html: str):
    lowered = html.lower()
    assert "<script" not in lowered and "<img" not in lowered


# -- escaping -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("evil", [SCRIPT, IMG])
def test_token_text_is_escaped(evil):
    html = render_token(tok(evil))
    assert_inert(html)
    assert "&lt;" in html


@pytest.mark.parametrize("evil", [SCRIPT, IMG])
def test_rejected_text_is_escaped(evil):
    html = render_token(tok("ok", "corrected", rejected_token_id=7, rejected_text=evil))
    assert_inert(html)
    assert 'class="tok tok-rejected"' in html


@pytest.mark.parametrize("evil", [SCRIPT, IMG])
def test_prompt_and_cache_match_are_escaped(evil):
    assert_inert(render_user(evil))
    assert_inert(render_cache_note(CacheEvent("verified", matched_prompt=evil, similarity=0.95, reason=evil)))
    assert_inert(error_html(evil))
    assert_inert(pair_status_html({"target": evil, "draft": evil, "target_precision": "bf16",
                                   "draft_precision": evil, "device": "cpu"}))


def test_title_quotes_cannot_break_out_of_the_attribute():
    html = render_token(tok('x" onmouseover="alert(1)', "corrected", rejected_token_id=3, rejected_text='"><b>'))
    assert 'onmouseover="' not in html
    assert "<b>" not in html


def test_newlines_become_breaks_and_empty_pieces_render_nothing():
    assert "<br>" in render_token(tok("a\nb"))
    assert render_token(tok("")) == ""


# -- kinds, legend, titles ----------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", TOKEN_KINDS)
def test_kind_maps_to_css_class(kind):
    assert f'class="tok tok-{kind}"' in render_token(tok("x", kind))


def test_unknown_kind_does_not_leak_into_the_class():
    assert 'class="tok tok-unknown"' in render_token(tok("x", kind='evil" onclick="x'))


def test_legend_has_every_kind_and_the_ghost():
    html = legend_html()
    for kind in TOKEN_KINDS:
        assert f'class="tok tok-{kind}"' in html
    assert "tok-rejected" in html


def test_title_shows_p_q_and_step():
    title = token_title(tok(p_target=0.25, q_draft=None, step=7))
    assert "p_target 0.250" in title and "q_draft –" in title and "step 7" in title


def test_ghost_is_optional():
    event = tok("b", "corrected", rejected_token_id=3, rejected_text="a")
    assert "tok-rejected" in render_token(event, show_rejected=True)
    assert "tok-rejected" not in render_token(event, show_rejected=False)


def test_answer_shows_finish_and_streaming_marker():
    assert "stopped by you" in render_answer([tok()], finish_reason="cancelled")
    assert "tokstream streaming" in render_answer([tok()], streaming=True)
    stopped = mark_stopped(render_answer([tok()], streaming=True))
    assert "streaming" not in stopped and "stopped by you" in stopped


# -- stats --------------------------------------------------------------------------------------------------
def test_format_stats():
    values = format_stats(stats())
    assert values["tokens/s"] == "6.0"
    assert values["acceptance"] == "50%"
    assert values["mean accepted"] == "2.00"
    assert values["k"] == "4" and values["steps"] == "4" and values["tokens"] == "12"
    assert format_stats(None)["tokens/s"] == "–"


def test_render_stats_shows_cache_outcome_and_meter():
    baseline = {"tokens_per_s": 3.0, "how": "best of 2 runs"}
    html = render_stats(stats(), CacheEvent("verified", matched_prompt="hi", similarity=0.9), baseline)
    assert 'data-outcome="verified"' in html
    assert "2.00× target-only" in html and "best of 2 runs" in html
    assert speedup(stats(), baseline) == pytest.approx(2.0)


COSTS = dict(verify_fixed_s=0.2, verify_per_token_s=0.05, draft_per_token_s=0.02)


def test_theory_uses_the_engine_cost_model():
    s = stats(rejected=4, **COSTS)  # 8 accepted, 4 rejections: alpha = 2/3
    assert s.alpha == pytest.approx(2 / 3)
    assert theoretical_speedup(s, 4) == pytest.approx(StepCosts(**COSTS).speedup(2 / 3, 4))
    assert theoretical_speedup(s, 0) == pytest.approx(1.0)
    assert theoretical_speedup(stats(), 4) is None  # no fitted costs yet
    values = format_stats(s)
    assert values["verify ms"] == "200 + 50·n" and values["draft ms/token"] == "20"
    assert "cost model at this k:" in render_stats(s, None, {"tokens_per_s": 3.0, "how": "x"})


def test_plot_frames():
    s = stats(rejected=4, **COSTS)
    acc = acceptance_frame(s)
    assert list(acc["position"]) == ["01", "02", "03", "04"]
    assert sorted(acceptance_frame(StatsEvent(1, 1, 12, 12, 1.0, 12, accepted_by_pos=(1,) * 12,
                                              proposed_by_pos=(1,) * 12))["position"])[-3:] == ["10", "11", "12"]
    assert list(acc["acceptance"]) == [1.0, 0.5, 0.25, 0.25]
    frame = speedup_frame(s, {"tokens_per_s": 3.0})
    assert set(frame["series"]) == {"theory", "measured", "break-even"}
    theory = frame[frame["series"] == "theory"]
    assert theory["k"].min() == 0 and theory["speedup"].iloc[0] == pytest.approx(1.0)
    empty_speed, empty_acc = speedup_frame(None, None), acceptance_frame(None)
    assert empty_speed.empty and empty_acc.empty
    # typed even when empty, so the plots keep numeric axes after "Clear chat"
    assert str(empty_speed["speedup"].dtype) == "float64" and str(empty_acc["acceptance"].dtype) == "float64"


# -- turn, trace, race --------------------------------------------------------------------------------------
def done(ids=(1, 2), s=None, reason="eos"):
    return DoneEvent(reason, "ab", tuple(ids), s or stats())


def test_turn_collects_every_event_for_the_trace():
    turn = Turn()
    events = [CacheEvent("miss"), tok("a"), tok("b", "bonus"), stats(), done()]
    for e in events:
        turn.add(e)
    doc = trace_document(turn, [{"role": "user", "content": "hi"}], None, UISettings().to_dict())
    assert [e["type"] for e in json.loads(json.dumps(doc))["events"]] == ["cache", "token", "token", "stats", "done"]
    assert turn.kind_counts() == {"accepted": 1, "bonus": 1}
    rebuilt = Turn.from_dicts(json.loads(json.dumps(doc))["events"])  # what the stop button redraws from
    assert rebuilt.stats.acceptance_rate == 0.5 and rebuilt.cache.outcome == "miss"


def test_race_summary_identical_check():
    ref, spec = Turn(), Turn()
    ref.add(done((1, 2, 3), stats(elapsed_s=3.0)))
    spec.add(done((1, 2, 3), stats(elapsed_s=1.0)))
    assert "identical" in race_summary(ref, spec, greedy=True)
    spec2 = Turn()
    spec2.add(done((1, 9, 3)))
    assert "differ from position 1" in race_summary(ref, spec2, greedy=True)
    assert "same distribution" in race_summary(ref, spec2, greedy=False)


# -- settings and cache wiring -------------------------------------------------------------------------------
def test_settings_validation_comes_from_the_engine_configs():
    with pytest.raises(InvalidSettingError):
        spec_config(UISettings(k=0))
    with pytest.raises(InvalidSettingError):
        spec_config(UISettings(k=None))
    assert sampling_config(UISettings(seed=" 3 ", max_new_tokens=16.0)).seed == 3
    assert sampling_config(UISettings(seed="")).seed is None
    with pytest.raises(InvalidSettingError):
        sampling_config(UISettings(seed="abc"))


class FakeCache:
    def __init__(self):
        self.items = [{"key": "k1", "prompt": SCRIPT, "answer": IMG, "created": 0}]

    def stats(self):
        return {"lookups": 4, "hits": {"exact": 1, "verified": 1}, "hit_rate": 0.5, "time_saved_s": 2.5}

    def entries(self, limit):
        return self.items[:limit]

    def __len__(self):
        return len(self.items)


class FakeEngine:
    """Duck-typed ChatEngine that replays hand-made events."""
    cache = FakeCache()

    def __init__(self, events):
        self.events = events
        self.calls = []

    def info(self):
        return SimpleNamespace(target="t", draft="d", target_precision="bf16", draft_precision="nf4", device="cpu")

    def generate(self, messages, sampling, spec, cancel=None, cache_mode="verify", cache_threshold=0.9):
        self.calls.append(dict(messages=messages, cache_mode=cache_mode, cache_threshold=cache_threshold))
        if not messages[-1]["content"].strip():
            raise EmptyPromptError("the message is empty")
        yield from self.events

    def generate_reference(self, messages, sampling, cancel=None):
        yield tok("x", "target")
        yield done((1,), stats(new_tokens=32, elapsed_s=4.0))


def test_cache_options_pass_through_one_function():
    engine = FakeEngine([])
    assert cache_options(engine, UISettings(cache_mode="direct", cache_threshold=0.8)) == {
        "cache_mode": "direct", "cache_threshold": 0.8}
    assert cache_options(engine, UISettings(cache_enabled=False))["cache_mode"] == "off"
    assert cache_options(engine, UISettings(), off=True)["cache_mode"] == "off"
    assert cache_options(object(), UISettings()) == {}


def test_cache_panel_escapes_and_counts():
    html = cache_summary_html(FakeCache())
    assert_inert(html)
    assert "50.0%" in html and ">1<" in html and "exact 1 · verified 1" in html and "2.5 s" in html
    assert "time saved" in html
    assert entries_frame(FakeCache())["prompt"][0] == SCRIPT  # a Dataframe shows text, never HTML
    assert "not available" in cache_summary_html(None)


def test_baseline_is_measured_once_and_cached(tmp_path):
    engine, store = FakeEngine([]), BaselineStore(tmp_path / "b.json")
    first = get_or_measure(engine, store)
    assert first["tokens_per_s"] == pytest.approx(8.0)
    engine.generate_reference = None  # a second call must not measure again
    assert get_or_measure(engine, BaselineStore(tmp_path / "b.json")) == first
    assert baseline_key(engine.info()) in json.loads((tmp_path / "b.json").read_text())


# -- the chat handler with a fake engine ----------------------------------------------------------------------
ELEMS = {name: name for name in ("chatbot", "shown", "history", "trace", "stats", "accept_plot", "speed_plot",
                                 "msg", "error_box")}


def test_stream_answer_renders_tokens_stats_and_history(tmp_path):
    events = [CacheEvent("miss"), tok(SCRIPT), tok("!", "corrected", rejected_token_id=2, rejected_text=IMG),
              stats(), done()]
    ctx = AppContext(FakeEngine(events), BaselineStore(tmp_path / "b.json"))
    updates = list(stream_answer(ctx, ELEMS, [], [], "hi", UISettings(), "s1"))
    last = updates[-1]
    shown = last["chatbot"][-1]["content"]
    assert "tok-accepted" in shown and "tok-corrected" in shown
    assert_inert(shown)
    assert last["history"][-1] == {"role": "assistant", "content": "ab"}
    assert "done (eos)" in last["stats"]
    assert ctx.engine.calls[0]["cache_mode"] == "verify"


def test_stream_answer_shows_engine_errors_and_changes_nothing(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    with pytest.warns(UserWarning):
        updates = list(stream_answer(ctx, ELEMS, [], [], "   ", UISettings(), "s1"))
    assert len(updates) == 1 and "the message is empty" in updates[0]["error_box"]
    assert "chatbot" not in updates[0] and "history" not in updates[0]


def test_cancel_flags_are_per_session():
    ctx = AppContext(FakeEngine([]))
    a, b = ctx.cancels.new("a"), ctx.cancels.new("b")
    assert ctx.cancels.cancel("a") and a.is_set() and not b.is_set()
    assert isinstance(a, threading.Event) and not ctx.cancels.cancel("nobody")
    with ctx.cancels.scope("b", b):
        assert ctx.cancels.cancel("b")
    assert not ctx.cancels.cancel("b")  # a finished generation has no flag left


def test_app_modules_do_not_import_torch():
    code = ("import sys, app.ui, app.chat, app.race, app.cache_panel, app.api, launch; "
            "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_meter_says_served_from_cache_instead_of_a_speed_ratio():
    from app.stats_view import render_stats
    from engine.events import CacheEvent
    stats = StatsEvent(0, 40, 0, 0, 0.001, 0)
    html = render_stats(stats, CacheEvent("exact", "q", 1.0), {"tokens_per_s": 7.0, "how": "x"})
    assert "served from the cache" in html and "target-only</span>" not in html
