"""Which weights fastest runs a GGUF target on (engine/models/repack_probe.py): both candidates timed in a child
process on this machine, priced on an answer, the cheaper kept. Which one wins depends on the CPU kind (repacked on
Zen 5, as stored on Zen 3), so no test here expects either: they check that the choice follows the figures."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from engine.backends.llama_cpp import FAST_AS_STORED, FAST_SETTINGS, repack_fault
from engine.models import repack_probe
from engine.models.cpu_watch import BUSY_SHARE
from engine.models.repack_probe import ANSWER_ONE, ANSWER_WIDE, MARGIN, WIDE, answer_s, choose
from tests.helpers.constants import SMOL


def _figures(repacked: tuple[float, float], stored: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {"repacked": {"one_ms": repacked[0], "wide_ms": repacked[1]},
            "as stored": {"one_ms": stored[0], "wide_ms": stored[1]}}


def test_the_cheaper_answer_wins_and_a_level_one_keeps_the_weights_as_stored():
    """The 1.5B target's figures at context 300 (docs/bench.md): on Zen 5 a repacked one-token forward is cheap enough
    to pay for its slower prefill, on Zen 3 both are slower repacked; within ``MARGIN`` the weights stay as stored."""
    zen5 = _figures((27, 487), (37, 386))
    assert choose(zen5)[0] == FAST_SETTINGS
    zen3 = _figures((70, 1951), (62, 1545))
    settings, why = choose(zen3)
    assert settings == FAST_AS_STORED
    assert "repacked 70 ms a token, 1951 ms for 64" in why and "as stored 62 ms a token, 1545 ms for 64" in why
    assert f"{answer_s(zen3['repacked']):.1f} s repacked, {answer_s(zen3['as stored']):.1f} s as stored" in why
    stored_s = answer_s(zen3["as stored"])
    one = (1 - MARGIN / 2) * stored_s * 1000 / ANSWER_ONE  # repacked cheaper by half the margin, all in its steps
    level = _figures((one, 0.0), (stored_s * 1000 / ANSWER_ONE, 0.0))
    assert ANSWER_WIDE * WIDE == 256 and choose(level)[0] == FAST_AS_STORED
    cheaper = _figures((one * (1 - MARGIN), 0.0), (stored_s * 1000 / ANSWER_ONE, 0.0))
    assert choose(cheaper)[0] == FAST_SETTINGS


@pytest.mark.real
@pytest.mark.usefixtures("llama_cpp")
def test_the_probe_times_both_weights_on_a_real_file_and_fastest_takes_what_its_figures_choose():
    """The child process (``python -m engine.models.repack_probe PATH``) times SmolLM2's GGUF file with each setting;
    ``fastest_weights`` takes the settings its figures choose and says them. Where repacked weights cannot run here,
    the child fails and fastest keeps the weights as stored, naming the fault (``repack_fault`` finds the same)."""
    from engine.models.sources import gguf_file

    path = gguf_file(SMOL)
    settings, why, fault = repack_probe.fastest_weights(path)
    if fault is not None:
        assert settings == FAST_AS_STORED and why == fault and "with repacked weights" in fault
        assert repack_fault(path) is not None
        return
    if Path(path).resolve() not in repack_probe._KEPT:  # other processes took the CPUs while it timed: nothing chosen or kept
        assert settings == FAST_AS_STORED and why.startswith("weights as stored: other processes took ")
    else:
        assert settings in (FAST_SETTINGS, FAST_AS_STORED) and why.startswith("measured here: repacked ")
        assert f"ms for {WIDE}" in why and f"{ANSWER_ONE} tokens)" in why
    done = subprocess.run([sys.executable, "-m", "engine.models.repack_probe", str(path)], capture_output=True,
                          text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures) == {"repacked", "as stored", "others_share"}
    assert figures["others_share"] is None or 0 <= figures["others_share"] <= 1
    assert all(figures[name]["one_ms"] > 0 and figures[name]["wide_ms"] > figures[name]["one_ms"]
               for name in ("repacked", "as stored"))
    assert choose(figures)[1].startswith("measured here: repacked ")


def _child(monkeypatch, outcome) -> list[str]:
    """Plants the child process's outcome (its JSON figures, or an exception) under ``fastest_weights``; returns
    the list each call's file is added to (the path the child was given, its name only). The real child is timed in the test above."""
    calls: list[str] = []

    def run(argv, **_):
        calls.append(Path(argv[-1]).name)
        if isinstance(outcome, BaseException):
            raise outcome
        return subprocess.CompletedProcess(argv, 0, stdout=json.dumps(outcome) + "\n", stderr="")
    monkeypatch.setattr(repack_probe.subprocess, "run", run)
    monkeypatch.setattr(repack_probe, "_KEPT", {})
    return calls


def test_a_busy_or_timed_out_probe_keeps_the_weights_as_stored_and_the_next_load_measures_again(monkeypatch):
    """Figures timed while other processes took more than ``BUSY_SHARE`` of the CPUs price the machine's load: they
    choose nothing and are not kept, so the next call runs the child again; a quiet probe's choice is kept for the
    process. A probe that outlasts its timeout also keeps the weights as stored, and says so."""
    zen5 = _figures((27, 487), (37, 386))
    calls = _child(monkeypatch, {**zen5, "others_share": BUSY_SHARE + 0.2})
    for _ in range(2):
        settings, why, fault = repack_probe.fastest_weights("model.gguf")
        assert settings == FAST_AS_STORED and fault is None
        assert why.startswith(f"weights as stored: other processes took {BUSY_SHARE + 0.2:.0%} of the CPUs ")
        assert why.endswith("price the machine's load; the next load measures again")
    assert calls == ["model.gguf", "model.gguf"]
    calls = _child(monkeypatch, {**zen5, "others_share": BUSY_SHARE - 0.2})
    assert repack_probe.fastest_weights("model.gguf") == (*choose(zen5), None)
    assert repack_probe.fastest_weights("model.gguf")[0] == FAST_SETTINGS and calls == ["model.gguf"]
    assert repack_probe.fastest_weights(Path("model.gguf").resolve()) == (*choose(zen5), None)  # one file, one choice
    assert repack_probe.fastest_weights("./sub/../model.gguf")[0] == FAST_SETTINGS and calls == ["model.gguf"]
    calls = _child(monkeypatch, subprocess.TimeoutExpired(["probe"], 5.0))
    settings, why, fault = repack_probe.fastest_weights("model.gguf", timeout_s=5.0)
    assert settings == FAST_AS_STORED and fault is None and why.endswith("took over 5 s here, so nothing was measured; the next load measures again")
    repack_probe.fastest_weights("model.gguf", timeout_s=5.0)
    assert calls == ["model.gguf", "model.gguf"]
