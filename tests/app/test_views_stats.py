"""app/views/stats.py: the numbers panel, the break-even meter and the data behind the two plots."""
import pytest

from app.views.stats import (acceptance_frame, cut_text, format_stats, render_stats, speedup, speedup_frame,
                             theoretical_speedup)
from engine.events import CacheEvent, DraftCut, StatsEvent
from engine.costs.costmodel import StepCosts
from tests.helpers.fakes import stats


def test_format_stats():
    values = format_stats(stats())
    assert values["tokens/s"] == "6.0" and values["decode tok/s"] == "10.0"  # end to end, and after the first token
    assert values["acceptance"] == "50%"
    assert values["mean accepted"] == "2.00"
    assert values["k"] == "4" and values["steps"] == "4" and values["tokens"] == "12"
    assert format_stats(None)["tokens/s"] == "–"


def test_render_stats_shows_cache_outcome_and_meter():
    baseline = {"tokens_per_s": 3.0, "decode_tokens_per_s": 5.0, "how": "best of 2 runs"}
    html = render_stats(stats(), CacheEvent("verified", matched_prompt="hi", similarity=0.9), baseline)
    assert 'data-outcome="verified"' in html
    assert "2.00× target-only" in html and "best of 2 runs" in html
    assert speedup(stats(), baseline) == pytest.approx(2.0)  # decode rate over decode rate: 10 / 5


def test_the_panel_shows_the_engines_own_rates_and_the_meter_compares_decode_with_decode():
    """The panel's figures are the StatsEvent's (the engine's clock, not the UI's), and the meter divides the
    answer's decode rate by the target-only decode rate: a slow prefill or a slow page moves neither."""
    s = StatsEvent(new_tokens=41, elapsed_s=5.0, k=0, first_token_s=1.0)
    assert s.tokens_per_s == pytest.approx(8.2) and s.decode_tokens_per_s == pytest.approx(10.0)
    values = format_stats(s)
    assert values["tokens/s"] == f"{s.tokens_per_s:.1f}" and values["decode tok/s"] == f"{s.decode_tokens_per_s:.1f}"
    assert speedup(s, {"tokens_per_s": 8.2, "decode_tokens_per_s": 10.0}) == pytest.approx(1.0)
    assert speedup(StatsEvent(new_tokens=1, elapsed_s=1.0, k=0, first_token_s=1.0), {"decode_tokens_per_s": 10.0}) \
        is None  # one token: no decode rate yet
    assert speedup(s, {"tokens_per_s": 8.2}) is None  # a record without a decode rate is not compared


COSTS = StepCosts(verify_fixed_s=0.2, verify_per_token_s=0.05, draft_per_token_s=0.02)


def test_theory_uses_the_engine_cost_model():
    s = stats(rejected_steps=4, costs=COSTS)  # 8 accepted, 4 rejections: alpha = 2/3
    assert s.acceptance.alpha == pytest.approx(2 / 3)
    assert theoretical_speedup(s, 4) == pytest.approx(COSTS.speedup(2 / 3, 4))
    assert theoretical_speedup(s, 0) == pytest.approx(1.0)
    assert theoretical_speedup(stats(), 4) is None  # no fitted costs yet
    values = format_stats(s)
    assert values["verify ms"] == "200 + 50·n" and values["draft ms/token"] == "20"
    assert "cost model at this k:" in render_stats(s, None, {"decode_tokens_per_s": 3.0, "how": "x"})


def test_plot_frames():
    s = stats(rejected_steps=4, costs=COSTS)
    acc = acceptance_frame(s)
    assert list(acc["position"]) == ["01", "02", "03", "04"]
    long = stats(steps=1, proposed=12, accepted=12, accepted_by_pos=(1,) * 12, proposed_by_pos=(1,) * 12)
    assert sorted(acceptance_frame(long)["position"])[-3:] == ["10", "11", "12"]
    assert list(acc["acceptance"]) == [1.0, 0.5, 0.25, 0.25]
    frame = speedup_frame(s, {"decode_tokens_per_s": 3.0})
    assert set(frame["series"]) == {"theory", "measured", "break-even"}
    theory = frame[frame["series"] == "theory"]
    assert theory["k"].min() == 0 and theory["speedup"].iloc[0] == pytest.approx(1.0)
    empty_speed, empty_acc = speedup_frame(None, None), acceptance_frame(None)
    assert empty_speed.empty and empty_acc.empty
    # typed even when empty, so the plots keep numeric axes after "Clear chat"
    assert str(empty_speed["speedup"].dtype) == "float64" and str(empty_acc["acceptance"].dtype) == "float64"


def test_meter_says_served_from_cache_instead_of_a_speed_ratio():
    stats = StatsEvent(40, 0.001, 0)
    html = render_stats(stats, CacheEvent("exact", "q", 1.0), {"decode_tokens_per_s": 7.0, "how": "x"})
    assert "served from the cache" in html and "target-only</span>" not in html


def test_the_stats_panel_says_when_and_why_a_proposer_was_held_back():
    held = stats(steps=40, cut_steps=12, latest_cut=DraftCut("lookup", 9, 2, 0.046), fallback=True)
    html = render_stats(held, None, None)
    assert "12 of 40 steps cut their free draft; latest: lookup span cut 9 → 2: verify costs 46 ms per token here" in html
    assert "speculation paused; at this acceptance" in html  # no fitted costs: no prices to cite
    assert 'data-stat="policy"' not in render_stats(stats(), None, None)  # nothing held back: nothing said
    priced = render_stats(stats(fallback=True, costs=StepCosts(0.040, 0.021, 0.019)), None, None)
    assert ("speculation paused: on this machine a draft token costs 19 ms and verifying one more 21 ms, against "
            "61 ms a target step") in priced


def test_the_stats_panel_counts_a_predictions_tokens_apart_and_escapes_the_names():
    from engine.events import Acceptance

    mixed = stats(by_source=(("prediction", Acceptance(3, 40, 31)), ("<b>lookup", Acceptance(2, 8, 3))))
    html = render_stats(mixed, None, None)
    assert 'data-stat="sources"' in html and "prediction 31/40" in html and "&lt;b&gt;lookup 3/8" in html
    alone = stats(by_source=(("fast-draft", Acceptance(4, 16, 8)),))
    assert 'data-stat="sources"' not in render_stats(alone, None, None)  # one model draft: the cards say it all
    assert "prediction 5/9" in render_stats(stats(by_source=(("prediction", Acceptance(2, 9, 5)),)), None, None)


def test_a_cut_free_draft_in_words():
    assert cut_text(DraftCut("hybrid", 12, 3, 0.0123)) == "hybrid span cut 12 → 3: verify costs 12 ms per token here"
    assert cut_text(DraftCut("lookup", 5, 0, 0.2)) == "lookup span of 5 skipped: verify costs 200 ms per token here"
    assert cut_text(DraftCut("lookup", 5, 1)) == "lookup span cut 5 → 1"  # no fitted costs to cite
