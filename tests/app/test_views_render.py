"""app/views/render.py: each token as an escaped, classed span with its tooltip; the legend, errors, the answer."""
from dataclasses import replace

import pytest

from app.tabs.pair import pair_status_html
from app.views.render import (error_html, error_message, legend_html, render_answer, render_cache_note, render_token,
                              render_user, token_title)
from engine.errors import EmptyPromptError
from engine.events import TOKEN_KINDS, CacheEvent
from engine.surface import PairInfo
from tests.helpers.fakes import IMG, SCRIPT, FakeEngine, assert_inert, tok


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
    assert_inert(pair_status_html(PairInfo(target=evil, draft=evil, target_precision="bf16", draft_precision=evil,
                                           device="cpu", precision_note=evil)))
    assert_inert(pair_status_html(PairInfo(target="t", draft="d", target_precision="bf16", draft_precision="x",
                                           device="cpu", identity_note=evil, runner=evil)))


def test_the_pair_line_says_the_measured_identity_and_the_runner():
    html = pair_status_html(PairInfo(target="t", draft="d", target_precision="gguf", draft_precision="gguf",
                                     device="cpu", runner="llama.cpp 2 threads, flash attention on, repack off",
                                     identity_note="identical up to rounding ties (max drift 9.1 steps): "
                                                   "25/106 rows equal"))
    assert "llama.cpp 2 threads" in html and "max drift 9.1 steps" in html and "identity-note" in html


def test_the_pair_line_says_the_speed_the_pair_itself_measured():
    """One source for the pair's speed: the line reads the target-only speed from the pair it shows, nothing else."""
    pair = FakeEngine([]).info()
    assert "target-only 10.0 tok/s decoding, 8.0 end to end" in pair_status_html(pair)
    assert "target-only" not in pair_status_html(replace(pair, target_speed=None))


def test_title_quotes_cannot_break_out_of_the_attribute():
    html = render_token(tok('x" onmouseover="alert(1)', "corrected", rejected_token_id=3, rejected_text='"><b>'))
    assert 'onmouseover="' not in html
    assert "<b>" not in html


def test_newlines_become_breaks_and_empty_pieces_render_nothing():
    assert "<br>" in render_token(tok("a\nb"))
    assert render_token(tok("")) == ""


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


def test_a_cache_that_could_not_be_used_shows_an_escaped_warning():
    note = render_cache_note(CacheEvent("miss", reason="cache unavailable: <b>Redis</b> at redis://:***@h:1/0"))
    assert "cache-warning" in note and "&lt;b&gt;Redis&lt;/b&gt;" in note and "<b>" not in note
    assert render_cache_note(CacheEvent("miss")) == ""
