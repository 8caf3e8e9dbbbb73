"""app/tabs/race.py: the race summary's identity check, the divergence explained, the fp32 proof offered."""
from dataclasses import replace
from types import SimpleNamespace

from app.baseline import BaselineStore
from app.context import AppContext
from app.settings import UISettings
from app.tabs.race import RaceTab, prove_race, race_summary, run_race
from app.turn import Turn, trace_document
from engine.events import CacheEvent
from tests.helpers.fakes import RaceEngine, assert_inert, div_dict, done, named, stats, tok


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


def test_race_explains_the_divergence_and_proves_it(tmp_path):
    engine = RaceEngine([CacheEvent("off"), tok("a"), tok("c", "corrected"), stats(), done((1, 3))])
    ctx = AppContext(engine, BaselineStore(tmp_path / "b.json"))
    last = list(run_race(ctx, named(RaceTab), "q", UISettings(k=3), "s1"))[-1]
    assert engine.explained == ([1], [1, 3])  # the FakeEngine's reference answer is (1,)
    assert "tie within bf16 rounding" in last["summary"] and "token 12" in last["summary"]
    assert last["prove"]["visible"] is True
    trace = last["trace"]
    assert trace["divergence"]["position"] == 12 and "not a speculation error" in trace["divergence"]["explanation"]
    proved = prove_race(ctx, named(RaceTab), trace)
    assert "✓ identical in fp32" in proved["proof"] and engine.proved == ([{"role": "user", "content": "q"}], True, 3)
    assert proved["trace"]["fp32_proof"] == {"identical": True}


def test_a_divergence_where_the_load_check_claimed_identity_is_flagged_and_can_be_proved(tmp_path):
    """Where the load-time check found every verify row equal, a divergence contradicts it: the race says so in
    words, and "Prove it" is offered as for any divergence (it used to hide there)."""
    class InvariantRaceEngine(RaceEngine):
        def info(self):
            return replace(super().info(), target_precision="int8-weight", bit_identical=True,
                           identity_note="verified bit-identical on this machine: 106/106 rows")

    engine = InvariantRaceEngine([CacheEvent("off"), tok("a"), tok("c", "corrected"), stats(), done((1, 3))])
    last = list(run_race(AppContext(engine, BaselineStore(tmp_path / "b.json")), named(RaceTab), "q", UISettings(k=3),
                         "s1"))[-1]
    assert last["prove"]["visible"] is True
    assert "although the load-time check found every verify row equal" in last["summary"]


def test_the_race_names_the_measured_identity():
    ref, spec = Turn(), Turn()
    ref.add(done((1, 2, 3), stats(elapsed_s=3.0)))
    spec.add(done((1, 2, 3), stats(elapsed_s=1.0)))
    claim = race_summary(ref, spec, greedy=True, bit_identical=True,
                         identity_note="verified <b>bit-identical</b>: 9/9 rows")
    assert "verified &lt;b&gt;bit-identical&lt;/b&gt;: 9/9 rows" in claim
    ties = race_summary(ref, spec, greedy=True, identity_note="identical up to rounding ties (max drift 2.0 steps)")
    assert "max drift 2.0 steps" in ties and "bit-identical" not in ties
