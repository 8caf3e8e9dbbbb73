"""Which weights fastest runs a GGUF target on (engine/models/repack_probe.py): both candidates timed in a child
process on this machine, priced on an answer, the cheaper kept. Which one wins depends on the CPU kind (repacked on
Zen 5, as stored on Zen 3), so no test here expects either: they check that the choice follows the figures."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from engine.backends.llama_cpp import FAST_AS_STORED, FAST_SETTINGS, repack_fault
from engine.models import repack_probe
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
    assert settings in (FAST_SETTINGS, FAST_AS_STORED) and why.startswith("measured here: repacked ")
    done = subprocess.run([sys.executable, "-m", "engine.models.repack_probe", str(path)], capture_output=True,
                          text=True, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(figures) == {"repacked", "as stored"}
    assert all(f["one_ms"] > 0 and f["wide_ms"] > f["one_ms"] for f in figures.values())
    assert choose(figures)[1].startswith("measured here: repacked ")
    assert f"ms for {WIDE}" in why and f"{ANSWER_ONE} tokens)" in why
