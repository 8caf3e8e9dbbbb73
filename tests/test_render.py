"""The UI's pure parts on hand-made events: escaping, kind classes, legend, stats, plots data, handlers. No browser."""
import inspect
import json
import subprocess
import sys
import threading
from types import SimpleNamespace

import gradio as gr
import pytest

from app.baseline import BaselineStore, baseline_key, get_or_measure
from app.tabs.cache import cache_summary_html, cache_view, entries_frame, make_cache_handlers
from app.tabs.chat import make_handlers, stream_answer
from app.components import create_cache_controls
from app.context import AppContext
from app.tabs.pair import pair_status_html
from app.tabs.race import race_summary
from app.views.render import (error_html, error_message, legend_html, render_answer, render_cache_note, render_token,
                        render_user, token_title)
from app.settings import UISettings, cache_config, sampling_config, spec_config
from app.views.stats import (acceptance_frame, format_stats, render_stats, speedup, speedup_frame,
                            theoretical_speedup)
from engine.speed.costmodel import StepCosts
from app.turn import Turn, trace_document
from engine.config import CACHE_OFF, DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, CacheConfig, SamplingConfig
from engine.errors import EmptyPromptError, InvalidSettingError, NoPairError
from engine.events import TOKEN_KINDS, CacheEvent, DoneEvent, StatsEvent, TokenEvent
from engine.lab.grid import DOCTOR_KINDS
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.surface import (SURFACE_MEMBERS, CacheEntry, CacheInfo, CacheStats, EngineSurface, PairInfo,
                            surface_problems)

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


def test_ghost_comes_only_with_a_corrected_token():
    event = tok("b", "corrected", rejected_token_id=3, rejected_text="a")
    assert render_token(event).index("tok-rejected") < render_token(event).index("tok-corrected")
    assert "tok-rejected" not in render_token(tok("b", "accepted"))


def test_error_message_keeps_engine_messages_and_names_bugs():
    assert error_message(EmptyPromptError("the message is empty")) == "the message is empty"
    assert error_message(KeyError("x")) == "unexpected error: KeyError: 'x'"


def test_answer_shows_finish_and_streaming_marker():
    assert "stopped by you" in render_answer([tok()], finish_reason="cancelled")
    assert "tokstream streaming" in render_answer([tok()], streaming=True)


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
    s = stats(rejected_steps=4, **COSTS)  # 8 accepted, 4 rejections: alpha = 2/3
    assert s.alpha == pytest.approx(2 / 3)
    assert theoretical_speedup(s, 4) == pytest.approx(StepCosts(**COSTS).speedup(2 / 3, 4))
    assert theoretical_speedup(s, 0) == pytest.approx(1.0)
    assert theoretical_speedup(stats(), 4) is None  # no fitted costs yet
    values = format_stats(s)
    assert values["verify ms"] == "200 + 50·n" and values["draft ms/token"] == "20"
    assert "cost model at this k:" in render_stats(s, None, {"tokens_per_s": 3.0, "how": "x"})


def test_plot_frames():
    s = stats(rejected_steps=4, **COSTS)
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


def test_race_summary_identical_check():
    ref, spec = Turn(), Turn()
    ref.add(done((1, 2, 3), stats(elapsed_s=3.0)))
    spec.add(done((1, 2, 3), stats(elapsed_s=1.0)))
    assert "identical" in race_summary(ref, spec, greedy=True)
    spec2 = Turn()
    spec2.add(done((1, 9, 3)))
    assert "differ from position 1" in race_summary(ref, spec2, greedy=True)
    assert "same distribution" in race_summary(ref, spec2, greedy=False)


def test_race_says_bit_identical_only_where_the_precision_is_batch_invariant():
    ref, spec = Turn(), Turn()
    ref.add(done((1, 2, 3), stats(elapsed_s=3.0)))
    spec.add(done((1, 2, 3), stats(elapsed_s=1.0)))
    assert "bit-identical" in race_summary(ref, spec, greedy=True, bit_identical=True)
    up_to_ties = race_summary(ref, spec, greedy=True, bit_identical=False)
    assert "bit-identical" not in up_to_ties and "up to rounding ties" in up_to_ties


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


def test_the_ui_passes_numbers_as_typed_and_the_engine_refuses_what_is_not_whole():
    """What the browser sends goes through each control's own preprocessing (as Gradio does), then to the engine's
    configs: no rounding on the way, so the engine's message is what the user reads."""
    from app.components import create_decoding_panel
    from engine.config import SpecConfig

    with gr.Blocks():
        panel = create_decoding_panel()
    seed = panel["seed"].preprocess(" 12345678901234567 ")
    assert sampling_config(UISettings(seed=seed)).seed == 12345678901234567  # not ...568 (through a float)
    assert spec_config(UISettings(k=panel["k"].preprocess(16))).k == 16
    assert sampling_config(UISettings(max_new_tokens=panel["max_new_tokens"].preprocess(16.0))).max_new_tokens == 16
    for field, typed, engine_check in [("k", 2.5, lambda: SpecConfig(k=2.5)),
                                       ("max_new_tokens", 3.5, lambda: SamplingConfig(max_new_tokens=3.5)),
                                       ("seed", "1.5", lambda: SamplingConfig(seed="1.5"))]:
        settings = UISettings(**{field: panel[field].preprocess(typed)})
        with pytest.raises(InvalidSettingError) as ui_error:
            (spec_config if field == "k" else sampling_config)(settings)
        with pytest.raises(InvalidSettingError) as engine_error:
            engine_check()
        assert str(ui_error.value) == str(engine_error.value)


class FakeEngine:
    """Replays hand-made events; its cache holds one hostile entry. The whole EngineSurface, nothing else (see
    test_fakes_and_the_engine_have_exactly_the_surface)."""

    def __init__(self, events, cache: bool = True):
        self.events = events
        self.calls = []
        self.entries = [CacheEntry("k1", SCRIPT, IMG, 0.0)] if cache else None

    def load_pair(self, target=DEFAULT_TARGET, draft=DEFAULT_DRAFT, target_precision=None, draft_precision=None):
        self.calls.append(dict(load=(target, draft, target_precision, draft_precision)))
        return self.info()

    def info(self):
        return PairInfo(target="t", draft="d", target_precision="bf16", draft_precision="nf4", device="cpu")

    def generate(self, messages, sampling, spec, *, cache=CacheConfig(), cancel=None):
        self.calls.append(dict(messages=messages, sampling=sampling, spec=spec, cache=cache, cancel=cancel))
        if not messages[-1]["content"].strip():
            raise EmptyPromptError("the message is empty")
        yield from self.events

    def generate_reference(self, messages, sampling, cancel=None):
        yield tok("x", "target")
        yield done((1,), stats(new_tokens=32, elapsed_s=4.0))

    def explain_divergence(self, messages, sampling, reference_ids, other_ids):
        return None

    def prove_fp32(self, messages, sampling, spec):
        self.proved = (messages, sampling.greedy, spec.k)
        return SimpleNamespace(identical=True, n_tokens=2, divergence=None, seconds=1.25, load_seconds=0.0,
                               to_dict=lambda: {"identical": True})

    def run_experiment(self, grid, cancel=None):
        """Hand-made cells (tests/test_experiments_app.py): one row per cell, Stop honoured between cells."""
        from tests.test_experiments_app import fake_experiment
        self.calls.append(dict(grid=grid, cancel=cancel))
        yield from fake_experiment(grid, cancel)

    def pair_doctor(self, kinds=DOCTOR_KINDS, probe_tokens=24, cancel=None):
        from tests.test_experiments_app import fake_doctor
        self.calls.append(dict(doctor=kinds))
        return fake_doctor(kinds)

    def cache_info(self):
        return CacheInfo(available=self.entries is not None, threshold=0.9, backend="redis://:***@<b>host</b>:1/0")

    def cache_stats(self):
        if self.entries is None:
            return None
        return CacheStats(entries=len(self.entries), lookups=4, hits={"exact": 1, "verified": 1}, misses=2,
                          hit_rate=0.5, time_saved_s=2.5)

    def cache_entries(self, limit=50):
        return (self.entries or [])[:limit]

    def cache_delete(self, key):
        if key not in [e.key for e in self.entries or []]:
            return False
        self.entries = [e for e in self.entries if e.key != key]
        return True

    def cache_clear(self):
        self.entries = [] if self.entries is not None else None


def _public_methods(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name))}


def test_fakes_and_the_engine_have_exactly_the_surface():
    """Names and parameters (names, kinds, defaults) as EngineSurface declares them; a fake has nothing more, so
    an app that called anything else on the engine would fail here, with the fakes."""
    from engine.chat_engine import ChatEngine
    from tests.test_openai_api import FakeEngine as ApiFakeEngine

    assert set(SURFACE_MEMBERS) == {"load_pair", "info", "generate", "generate_reference", "explain_divergence",
                                    "prove_fp32", "cache_info", "cache_stats", "cache_entries", "cache_delete",
                                    "cache_clear", "run_experiment", "pair_doctor"}
    for cls in (ChatEngine, FakeEngine, RaceEngine, ApiFakeEngine):
        assert surface_problems(cls) == [], cls
    for fake in (FakeEngine([]), RaceEngine([]), ApiFakeEngine()):
        assert isinstance(fake, EngineSurface)
        assert _public_methods(type(fake)) == set(SURFACE_MEMBERS), type(fake)


def test_a_drifted_fake_is_caught():
    class Drifted(FakeEngine):
        def generate(self, messages, sampling, spec, cache=CacheConfig(), cancel=None):  # cache not keyword-only
            yield from ()

        def cache_entries(self, limit=10):  # another default
            return []

    class Partial:
        def info(self):
            return None

    problems = surface_problems(Drifted)
    assert len(problems) == 2 and "Drifted.generate" in problems[0] and "Drifted.cache_entries" in problems[1]
    assert len(surface_problems(Partial)) == len(SURFACE_MEMBERS) - 1
    assert "Partial.load_pair is missing" in surface_problems(Partial)


def test_defaults_are_the_engine_configs():
    """One place: the UI's controls, /chat and /v1 start from engine.config's defaults."""
    s = UISettings()
    assert sampling_config(s) == SamplingConfig(seed=None) == DEFAULT_SAMPLING
    assert spec_config(s) == DEFAULT_SPEC and cache_config(s) == DEFAULT_CACHE
    from app.api.gradio_chat import make_chat_api
    params = inspect.signature(make_chat_api(AppContext(FakeEngine([])))).parameters
    assert params["max_new_tokens"].default == DEFAULT_SAMPLING.max_new_tokens
    assert params["temperature"].default == DEFAULT_SAMPLING.temperature and params["k"].default == DEFAULT_SPEC.k


def test_cache_controls_become_one_cache_config():
    assert cache_config(UISettings(cache_mode="direct", cache_threshold=0.85)) == CacheConfig("direct", 0.85)
    assert cache_config(UISettings(cache_enabled=False)) == CACHE_OFF
    with pytest.raises(InvalidSettingError, match="cache mode"):
        cache_config(UISettings(cache_mode="sometimes"))


def test_cache_panel_escapes_and_counts():
    engine = FakeEngine([])
    html = cache_summary_html(engine.cache_info(), engine.cache_stats())
    assert_inert(html)
    assert "<b>" not in html
    assert "50.0%" in html and ">1<" in html and "exact 1 · verified 1" in html and "2.5 s" in html
    assert "time saved" in html and "stored in redis://:***@&lt;b&gt;host" in html
    assert entries_frame(engine.cache_entries())["prompt"][0] == SCRIPT  # a Dataframe shows text, never HTML
    no_cache = FakeEngine([], cache=False)
    assert "not available" in cache_summary_html(no_cache.cache_info(), no_cache.cache_stats())
    warned = cache_summary_html(engine.cache_info(), CacheStats(entries=0, warning="Redis <i>unreachable</i>"))
    assert "cache-warning" in warned and "&lt;i&gt;unreachable" in warned


def test_cache_tab_deletes_and_clears_through_the_engine_methods():
    engine = FakeEngine([])
    handlers = make_cache_handlers(engine)
    summary, frame, pick = handlers["refresh"]()
    assert list(frame["key"]) == ["k1"] and pick["choices"] == [(f"{SCRIPT[:60]} [k1]", "k1")]
    _, frame, _ = handlers["delete"]("k1")
    assert frame.empty and engine.entries == []
    with pytest.warns(UserWarning, match="no such entry"):  # a warning toast, outside a Gradio request
        handlers["delete"]("k1")
    engine.entries = [CacheEntry("k2", "q", "a", 0.0)]
    _, frame, _ = handlers["clear"]()
    assert frame.empty and engine.entries == []
    assert "not available" in cache_view(FakeEngine([], cache=False))[0]


def test_cache_controls_start_from_the_engine_cache_settings():
    with gr.Blocks():
        on = create_cache_controls(CacheInfo(available=True, threshold=0.9))
        off = create_cache_controls(CacheInfo(available=False))
    assert on["cache_threshold"].value == 0.9 and on["cache_enabled"].value is True
    assert on["cache_mode"].value == DEFAULT_CACHE.mode
    assert off["cache_enabled"].value is False and off["cache_enabled"].interactive is False
    assert off["cache_threshold"].value == DEFAULT_CACHE.threshold


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
    updates = list(stream_answer(ctx, ELEMS, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1"))
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
        updates = list(stream_answer(ctx, ELEMS, history=[], shown=[], prompt="   ", settings=UISettings(),
                                     session="s1"))
    assert len(updates) == 1 and "the message is empty" in updates[0]["error_box"]
    assert "chatbot" not in updates[0] and "history" not in updates[0]


def test_cancel_flags_are_per_session():
    ctx = AppContext(FakeEngine([]))
    with ctx.cancels.running("a") as a, ctx.cancels.running("b") as b:
        assert ctx.cancels.cancel("a") and a.is_set() and not b.is_set()
        assert isinstance(a, threading.Event) and not ctx.cancels.cancel("nobody")
    assert b.is_set()  # leaving the block stops its generation
    assert not ctx.cancels.cancel("b")  # a finished generation has no flag left


def test_stop_decides_from_the_running_generation_not_the_html(tmp_path):
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), done()]), BaselineStore(tmp_path / "b.json"))
    stop, request = make_handlers(ctx, ELEMS)["stop"], SimpleNamespace(session_hash="s1")
    assert "Nothing is running" in stop(request)
    stream = stream_answer(ctx, ELEMS, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    next(stream)
    assert "Stopping at the next step" in stop(request) and ctx.engine.calls[0]["cancel"].is_set()
    list(stream)
    assert "Nothing is running" in stop(request)
    with pytest.warns(UserWarning):  # an answer that never started leaves nothing to stop
        list(stream_answer(ctx, ELEMS, history=[], shown=[], prompt=" ", settings=UISettings(), session="s1"))
    assert "Nothing is running" in stop(request)


_BUILD_UI_WITHOUT_ENGINE = """
import sys
import launch
import app.api.openai_routes, app.views.markdown, bench.speed.render, app.views.divergence
from app.context import AppContext
from app.ui import build_demo
from engine.errors import NoPairError
from tests.test_render import FakeEngine

class NoPairEngine(FakeEngine):
    def info(self):
        raise NoPairError("no models loaded yet")

demo = build_demo(AppContext(NoPairEngine([], cache=False)))
assert demo.fns, "the UI has no event handlers"
assert demo.analytics_enabled is False  # a local app calls nobody
bad = [m for m in ("torch", "transformers") if m in sys.modules]
assert not bad, f"building the UI imported {bad}"
"""


def test_building_the_ui_imports_no_torch():
    """Not only the imports: building the whole Blocks (dropdown choices, defaults, handlers) stays torch-free."""
    subprocess.run([sys.executable, "-c", _BUILD_UI_WITHOUT_ENGINE], check=True, timeout=300)


def test_context_hides_only_the_no_pair_error():
    class Broken:
        def info(self):
            raise KeyError("bug")

    class Empty:
        def info(self):
            raise NoPairError("none")

    assert AppContext(Empty()).pair() is None and AppContext(Empty()).baseline() is None
    with pytest.raises(KeyError):
        AppContext(Broken()).pair()


def test_closing_the_chat_stream_cancels_the_engine(tmp_path):
    """Stop (cancels=) and a closed tab close the handler generator; the engine's flag must be set then."""
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]),
                     BaselineStore(tmp_path / "b.json"))
    stream = stream_answer(ctx, ELEMS, history=[], shown=[], prompt="hi", settings=UISettings(), session="s1")
    next(stream), next(stream)
    flag = ctx.engine.calls[0]["cancel"]
    assert not flag.is_set()
    stream.close()
    assert flag.is_set()


def test_closing_an_api_request_cancels_the_engine(tmp_path):
    from app.api.gradio_chat import make_chat_api
    ctx = AppContext(FakeEngine([CacheEvent("miss"), tok("a"), stats(), tok("b"), stats(), done()]),
                     BaselineStore(tmp_path / "b.json"))
    answer = make_chat_api(ctx)("hi")
    assert next(answer)["cache"]["outcome"] == "miss"
    flag = ctx.engine.calls[0]["cancel"]
    assert not flag.is_set()
    answer.close()
    assert flag.is_set()
    finished = list(make_chat_api(ctx)("hi again"))[-1]
    assert finished["text"] == "ab" and finished["finish_reason"] == "eos"


def test_baselines_stay_in_memory_when_the_file_cannot_be_written(tmp_path):
    (tmp_path / "not-a-dir").write_text("x")
    store = BaselineStore(tmp_path / "not-a-dir" / "baselines.json")
    store.put("k", {"tokens_per_s": 5.0})
    assert store.get("k") == {"tokens_per_s": 5.0}
    assert "not-a-dir" in store.write_error and "memory" in store.write_error


def test_meter_says_served_from_cache_instead_of_a_speed_ratio():
    from app.views.stats import render_stats
    from engine.events import CacheEvent
    stats = StatsEvent(0, 40, 0, 0, 0.001, 0)
    html = render_stats(stats, CacheEvent("exact", "q", 1.0), {"tokens_per_s": 7.0, "how": "x"})
    assert "served from the cache" in html and "target-only</span>" not in html


def test_a_cache_that_could_not_be_used_shows_an_escaped_warning():
    from app.views.render import render_cache_note
    from engine.events import CacheEvent

    note = render_cache_note(CacheEvent("miss", reason="cache unavailable: <b>Redis</b> at redis://:***@h:1/0"))
    assert "cache-warning" in note and "&lt;b&gt;Redis&lt;/b&gt;" in note and "<b>" not in note
    assert render_cache_note(CacheEvent("miss")) == ""


# -- Markdown view ------------------------------------------------------------------------------------------------
from app.views.divergence import divergence_html, divergence_text, proof_html  # noqa: E402
from app.views.markdown import SourceText, render_markdown  # noqa: E402


def toks(*pieces, kinds=("accepted", "corrected", "bonus", "target")):
    return [tok(text, kinds[i % len(kinds)], token_id=i, step=i, rejected_text="RJ" if i % len(kinds) == 1 else None)
            for i, text in enumerate(pieces)]


def spans_text(html: str) -> list[tuple[str, str]]:
    """(kind, text) of every token span, in order (ghosts included as "rejected")."""
    import re
    return [(k, t) for k, t in re.findall(r'<span class="tok tok-([a-z]+)[^"]*" title="[^"]*">([^<]*)</span>', html)]


def test_code_fence_becomes_pre_code_with_token_and_pygments_classes():
    html = render_markdown(toks("Here:\n```py", "thon\ndef ad", "d(a, b):\n    re", "turn a + b\n```\nDone."))
    assert '<pre class="md-code" data-lang="python"><code>' in html
    code = html.split("<code>")[1].split("</code>")[0]
    assert 'class="tok tok-corrected hl-k"' in code  # "def": Pygments keyword inside a corrected token
    assert 'class="tok tok-bonus' in code and 'class="tok tok-target' in code
    assert "```" not in html and "python" not in code  # the fence lines are markup, not shown
    assert "    " in code  # indentation kept
    assert html.endswith("<p>" + html.split("<p>")[-1]) and "Done." in html.split("</pre>")[1]


def test_every_shown_character_keeps_its_token_across_markdown_syntax():
    pieces = ("# Ti", "tle\n\nSome **bo", "ld** and `co", "de` and *it", "al*\n\n- a", "\n- b")
    html = render_markdown(toks(*pieces))
    assert "<h1>" in html and "<strong>" in html and '<code class="md-inline-code">' in html and "<em>" in html
    assert "<ul><li>" in html
    shown = [(k, t) for k, t in spans_text(html) if k != "rejected"]
    # "bo" and "ld" come from different tokens: the bold word is split at the token boundary
    assert ("corrected", "bo") in shown and ("bonus", "ld") in shown
    assert ("bonus", "co") in shown and ("target", "de") in shown
    kinds = {0: "accepted", 1: "corrected", 2: "bonus", 3: "target"}
    for k, t in shown:  # each shown piece lies inside a token of that kind
        assert any(t in p for i, p in enumerate(pieces) if kinds[i % 4] == k), (k, t)


def test_rejected_ghost_and_tooltip_survive_in_the_markdown_view():
    html = render_markdown(toks("Say ", "**hi**"))
    assert '<span class="tok tok-rejected" title="rejected draft token">RJ</span>' in html
    assert html.count("tok-rejected") == 1  # once per token, though the token shows in several pieces
    assert "p_target 0.900" in html and "rejected draft token &#x27;RJ&#x27;" in html


@pytest.mark.parametrize("view", ["tokens", "markdown"])
def test_a_rejected_special_token_is_a_small_named_badge_escaped(view):
    def shown(rejected: str, special: str | None) -> str:
        ev = tok("Hi", "corrected", rejected_token_id=7, rejected_text=rejected, rejected_special=special)
        return render_token(ev) if view == "tokens" else render_markdown([ev])

    end = shown("<|im_end|>", "end")
    assert '<span class="tok tok-rejected tok-special" title="rejected draft token &lt;|im_end|&gt;">end of answer' \
           "</span>" in end
    assert "<|im_end|>" not in end
    other = shown("<|im_start|><b>", "control")  # any other special token: its own name, escaped
    assert ">&lt;|im_start|&gt;&lt;b&gt;</span>" in other and "<b>" not in other and "tok-special" in other
    plain = shown("<|im_end|>", None)  # text that only looks like one stays struck-through text
    assert "tok-special" not in plain and "&lt;|im_end|&gt;</span>" in plain


@pytest.mark.parametrize("evil", [SCRIPT, IMG, "<a href='x' onclick='alert(1)'>x</a>", "```\n<script>x</script>\n```"])
def test_markdown_view_escapes_raw_html(evil):
    html = render_markdown(toks("ok ", evil))
    assert_inert(html)
    assert "<a " not in html and "onclick='" not in html
    assert "&lt;" in html


def test_javascript_links_are_not_links_and_http_links_are_safe():
    html = render_markdown(toks("[x](javascript:alert(1)) [y](JAVASCRIPT:alert(2)) [z](data:text/html,hi) ",
                                "[ok](https://example.com/a?b=1&c=2) ![img](https://e.com/i.png)"))
    import re
    assert re.findall(r'href="([^"]*)"', html) == ["https://example.com/a?b=1&amp;c=2"]
    assert "[x](javascript:alert(1))" in html  # shown as the text it is
    assert html.count("<a ") == 1
    assert 'rel="noopener noreferrer nofollow"' in html
    assert "<img" not in html and "md-image" in html


def test_source_text_normalises_line_ends_like_markdown_it():
    src = SourceText.of(toks("a\r", "\nb\rc\0"))
    assert src.text == "a\nb\nc\ufffd" and src.owner == (0, 0, 1, 1, 1, 1)


def test_answer_holds_both_views_and_the_raw_view_is_unchanged():
    turn = Turn()
    for ev in toks("**x**", " y"):
        turn.add(ev)
    html = turn.html()
    assert '<div class="md-view"><p><strong>' in html and '<div class="raw-view">' in html
    assert html.count('class="tokstream') == 1
    from app.views.render import render_tokens
    assert f'<div class="raw-view">{render_tokens(toks("**x**", " y"))}</div>' in html


def test_render_bench_reports_milliseconds():
    from bench.speed.render import synthetic_tokens, time_updates
    tokens = synthetic_tokens(60)
    assert len(tokens) == 60 and "```python" in "".join(t.text for t in tokens)
    assert len(time_updates(tokens, every=20)) == 3


# -- divergences ----------------------------------------------------------------------------------------------------
def div_dict(margin=0.125, within=True, other_text="<img src=x onerror=alert(1)>"):
    return {"position": 12, "reference_token": 304, "other_token": 7923, "reference_text": " n",
            "other_text": other_text, "top_logit": 18.375, "top2_margin": margin, "tokens_gap": margin,
            "precision": "bf16", "rounding_step": 0.125, "within_rounding": within}


def test_divergence_explained_as_a_tie_with_position_tokens_and_margin():
    html = divergence_html(div_dict())
    assert_inert(html)
    text = divergence_text(div_dict())
    assert "token 12" in text and "' n' (id 304)" in text and "(id 7923)" in text
    assert "margin there is 0.125" in text and "bf16 logits near 18.4 are 0.125 apart" in text
    assert "tie within bf16 rounding, not a speculation error" in text
    assert 'data-position="12"' in html and "race-tie" in html


def test_a_wide_margin_is_called_a_bug():
    text = divergence_text(div_dict(margin=3.5, within=False))
    assert "would be a bug" in text and "tie" not in text
    assert "race-bug" in divergence_html(div_dict(margin=3.5, within=False))


def test_race_summary_and_trace_carry_the_explanation():
    ref, spec = Turn(), Turn()
    ref.add(done((1, 2, 3), stats(new_tokens=3)))
    spec.add(done((1, 2, 4), stats(new_tokens=3)))
    div = SimpleNamespace(**{k: v for k, v in div_dict().items() if k != "within_rounding"}, within_rounding=True,
                          to_dict=lambda: div_dict())
    html = race_summary(ref, spec, greedy=True, divergence=div)
    assert "differ from position" in html and "tie within bf16 rounding" in html
    assert_inert(html)
    doc = trace_document(spec, [{"role": "user", "content": "q"}], None, {}, divergence=div, reference=ref)
    assert doc["divergence"]["position"] == 12 and "tie within bf16" in doc["divergence"]["explanation"]
    assert doc["target_only_events"] == ref.events


def test_fp32_proof_says_identical_with_timing_or_the_honest_result():
    ok = {"identical": True, "n_tokens": 20, "divergence": None, "seconds": 3.21, "load_seconds": 1.5}
    assert "✓ identical in fp32: 20 tokens" in proof_html(ok) and "3.2 s" in proof_html(ok)
    assert "1.5 s loading" in proof_html(ok)
    bad = {**ok, "identical": False, "divergence": div_dict(margin=2.0, within=False)}
    assert "still different in fp32" in proof_html(bad) and "bug" in proof_html(bad)
    assert_inert(proof_html(bad))


class RaceEngine(FakeEngine):
    """A race whose answers differ at token 1, explained as a tie (and the fake's fp32 proof)."""

    def explain_divergence(self, messages, sampling, reference_ids, other_ids):
        self.explained = (reference_ids, other_ids)
        d = div_dict()
        return SimpleNamespace(**{k: v for k, v in d.items() if k != "within_rounding"}, within_rounding=True,
                               to_dict=lambda: d)


def test_race_explains_the_divergence_and_proves_it(tmp_path):
    from app.tabs.race import prove_race, run_race
    elems = {n: n for n in ("error_box", "race_summary", "race_target", "race_spec", "race_prove", "race_proof",
                            "race_trace")}
    engine = RaceEngine([CacheEvent("off"), tok("a"), tok("c", "corrected"), stats(), done((1, 3))])
    ctx = AppContext(engine, BaselineStore(tmp_path / "b.json"))
    last = list(run_race(ctx, elems, "q", UISettings(k=3), "s1"))[-1]
    assert engine.explained == ([1], [1, 3])  # the FakeEngine's reference answer is (1,)
    assert "tie within bf16 rounding" in last["race_summary"] and "token 12" in last["race_summary"]
    assert last["race_prove"]["visible"] is True
    trace = last["race_trace"]
    assert trace["divergence"]["position"] == 12 and "not a speculation error" in trace["divergence"]["explanation"]
    proved = prove_race(ctx, elems, trace)
    assert "✓ identical in fp32" in proved["race_proof"] and engine.proved == ([{"role": "user", "content": "q"}],
                                                                                   True, 3)
    assert proved["race_trace"]["fp32_proof"] == {"identical": True}


def test_prove_it_is_not_offered_where_the_precision_has_no_ties(tmp_path):
    """An int4 target on the CPU is batch-invariant: a divergence there cannot be a tie, fp32 cannot settle it."""
    from dataclasses import replace

    from app.tabs.race import run_race

    class InvariantRaceEngine(RaceEngine):
        def info(self):
            return replace(super().info(), target_precision="int4", bit_identical=True)

    elems = {n: n for n in ("error_box", "race_summary", "race_target", "race_spec", "race_prove", "race_proof",
                            "race_trace")}
    engine = InvariantRaceEngine([CacheEvent("off"), tok("a"), tok("c", "corrected"), stats(), done((1, 3))])
    last = list(run_race(AppContext(engine, BaselineStore(tmp_path / "b.json")), elems, "q", UISettings(k=3), "s1"))[-1]
    assert last["race_prove"]["visible"] is False
