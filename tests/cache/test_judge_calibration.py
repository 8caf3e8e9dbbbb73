"""A paraphrase judge for every precision the app loads on a CPU, or a sentence saying why none judges, and the
command that calibrates one (bench.cache.calibrate)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from bench.cache import calibrate
from engine.cache.guards import judge_decides
from engine.cache.judge import CANNOT_JUDGE, YES_THRESHOLDS, judge_for, uncalibrated_note
from engine.models.auto import CPU_CHOICES
from tests.helpers.constants import SMOL

QWEN = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")


@pytest.mark.parametrize("kind", CPU_CHOICES)
@pytest.mark.parametrize("name", QWEN)
def test_every_precision_auto_picks_on_a_cpu_is_calibrated_or_measured_unable(kind, name):
    """It was neither: only bf16 had thresholds, and auto picks int8-weight or int4 for a target on every CPU
    kind. The default target judges there; a model measured unable to separate says why in words."""
    precision = CPU_CHOICES[kind].target
    target = SimpleNamespace(name=name, precision=precision)
    if name == QWEN[0]:
        assert (name, precision) in YES_THRESHOLDS and uncalibrated_note(target) == ""
    else:
        assert ((name, precision) in YES_THRESHOLDS) != ((name, precision) in CANNOT_JUDGE)
        if (name, precision) in CANNOT_JUDGE:
            assert "does not separate paraphrases from near-misses" in uncalibrated_note(target)


def test_a_precision_without_a_threshold_is_said_in_words():
    name = QWEN[0]
    nf4 = SimpleNamespace(name=name, precision="nf4")  # CUDA's auto for a pair that does not fit: not measured here
    assert (name, "nf4") not in YES_THRESHOLDS and judge_for(nf4) is None
    assert f"no paraphrase-judge calibration for {name} at nf4" in uncalibrated_note(nf4)


def test_the_proposal_sits_just_above_every_near_miss():
    scores = [(0.97, True), (0.93, True), (0.88, True), (0.91, False), (0.42, False)]
    got = calibrate.propose(scores)
    assert got["threshold"] == 0.96 and got["max_negative"] == 0.91
    assert got["precision"] == 1.0 and got["recall"] == pytest.approx(1 / 3)
    assert calibrate.propose([(0.995, False), (0.999, True)])["threshold"] == 0.99  # capped below 1


def test_only_pairs_the_guards_leave_to_the_judge_set_the_threshold():
    assert judge_decides("How do I merge two dictionaries in Python?",
                         "What's the best way to combine two Python dicts?")
    assert not judge_decides("How do I convert Celsius to Fahrenheit?",
                             "How do I convert Fahrenheit to Celsius?")  # order: never on a verdict
    assert not judge_decides("What is the capital of Australia?", "Which city is Australia's capital?")


def test_a_bad_judge_name_exits_before_anything_loads(tmp_path, capsys):
    pairs = tmp_path / "p.jsonl"
    pairs.write_text('{"a": "x", "b": "y", "same": true}\n')
    with pytest.raises(SystemExit) as exit_:
        calibrate.main(["--pairs", str(pairs), "--judge", "no-such-model"])
    assert exit_.value.code == 2 and "no-such-model" in capsys.readouterr().err


@pytest.mark.real
def test_calibrate_scores_every_pair_with_the_real_model(tmp_path, capsys):
    with open("tests/data/paraphrases_calib_cpu.jsonl") as f:
        lines = f.readlines()[:6]
    pairs, out = tmp_path / "p.jsonl", tmp_path / "out.json"
    pairs.write_text("".join(lines))
    assert calibrate.main(["--pairs", str(pairs), "--judge", SMOL, "--judge-precision", "fp32",
                           "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["precision"] == "fp32" and len(report["pairs"]) == 6
    assert all(0.0 <= p["p_yes"] <= 1.0 for p in report["pairs"])
    negatives = [p["p_yes"] for p in report["pairs"] if not p["same"] and p["judged_in_the_app"]]
    assert report["proposal"]["threshold"] > max(negatives)
    assert "proposed threshold" in capsys.readouterr().out


@pytest.mark.parametrize("name", QWEN)
def test_the_precision_auto_picks_with_llama_cpp_is_calibrated_or_measured_unable(name):
    """With llama-cpp-python installed auto gives gguf on a CPU: the default target judges there, the 0.5B says why
    it does not."""
    target = SimpleNamespace(name=name, precision="gguf")
    if name == QWEN[0]:
        assert 0.5 < YES_THRESHOLDS[(name, "gguf")] < 1 and uncalibrated_note(target) == ""
    else:
        assert (name, "gguf") in CANNOT_JUDGE and (name, "gguf") not in YES_THRESHOLDS
        assert "its P(Yes) does not separate paraphrases from near-misses" in uncalibrated_note(target)


@pytest.mark.parametrize("precision, words", [("int8-weight", "judges near-hits the guards stop (serves at P(Yes) \u2265 0.85"),
                                              ("gguf", "at gguf judges near-hits the guards stop (serves at P(Yes) \u2265 0.83"),
                                              ("nf4", "no paraphrase-judge calibration for qwen2.5-coder-1.5b-instruct at nf4")])
def test_the_cache_panel_says_in_words_whether_direct_mode_judges(precision, words):
    from app.tabs.cache import cache_summary_html
    from engine.cache.judge import judge_line
    from engine.surface import CacheInfo, CacheStats

    line = judge_line(SimpleNamespace(name=QWEN[0], precision=precision))
    assert words in line
    html = cache_summary_html(CacheInfo(available=True, judge=line), CacheStats(entries=0))
    assert 'class="cache-judge"' in html and words.split("(serves at ")[-1] in html
