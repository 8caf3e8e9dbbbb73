"""engine/serve/verify_mode.py: where identity holds only up to some verify width, the default mode is chosen by the
verify costs measured at load, each mode priced on the pair line; ChatEngine.set_verify_mode switches it."""
import pytest

from engine.costs.costmodel import StepCosts
from engine.decode.identity import IdentityCheck
from engine.errors import InvalidSettingError
from engine.serve.verify_mode import FASTEST, IDENTICAL, VerifyChoice, choose_verify

WIDTHS = (2, 3, 4, 5, 6, 7, 8, 9, 17)
TILED = IdentityCheck(120, 140, WIDTHS, (24, 256), 9.4, (24, 8, 0), 1.0, unequal=((24, 8), (24, 9), (24, 17)))
SAME = IdentityCheck(140, 140, WIDTHS, (24, 256), 0.0, None, 1.0)


def _costs(table: dict[int, float]) -> StepCosts:
    return StepCosts(0.04, 0.01, 0.02, verify_table=tuple((n, 0.045 * t) for n, t in sorted(table.items())))


STEEP = _costs({1: 1.0, 2: 2.0, 4: 3.1, 8: 7.6, 16: 8.1})  # 2-core Zen 4, measured: a verify of 8 never pays
FLAT = _costs({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.4})  # a wide machine: long free drafts pay


def test_a_steep_curve_keeps_the_identical_width_and_a_flat_one_goes_fastest():
    steep = choose_verify(TILED, STEEP)
    assert (steep.mode, steep.cap, steep.width_cap) == (IDENTICAL, 7, 7)
    assert "identical (k <= 6)" in steep.note and "fastest (k <= 16)" in steep.note and "default identical" in steep.note
    assert "t(8) = 7.6" in steep.note
    flat = choose_verify(TILED, FLAT)
    assert (flat.mode, flat.width_cap) == (FASTEST, None) and "default fastest" in flat.note
    assert flat.with_mode(IDENTICAL).width_cap == 7  # the user may still choose identity, at the priced cost


def test_without_a_partial_width_there_is_nothing_to_choose():
    choice = choose_verify(SAME, STEEP)
    assert choice == VerifyChoice() and choice.width_cap is None and choice.note == ""
    with pytest.raises(InvalidSettingError, match="no identical/fastest choice"):
        choice.with_mode(IDENTICAL)
    with pytest.raises(InvalidSettingError, match="verify mode must be one of identical, fastest"):
        choose_verify(TILED, STEEP).with_mode("sideways")


def test_a_default_of_fastest_says_which_llama_cpp_settings_the_target_runs_with():
    """A default of fastest on the app's llama.cpp settings says so (models handed in run as given; a loaded pair's
    target switches: tests/backends/test_gguf_runner.py); a mode asked for keeps its mode and says nothing."""
    from engine.models.load_checks import LoadChecks, TargetSpeed
    from engine.serve.verify_mode import verify_choice as _verify_choice

    checks = LoadChecks(FLAT, TILED, TargetSpeed(10.0, 12.0, 0.2, 32, "runs"), "2026-12-06 08:00")
    default = _verify_choice(checks, on_app_settings=True)
    assert default.mode == FASTEST and default.offered and "app's llama.cpp settings, not fastest's" in default.runner
    assert _verify_choice(checks).runner == ""  # torch runs it: no llama.cpp settings to speak of
    asked = _verify_choice(checks, IDENTICAL, on_app_settings=True)
    assert (asked.mode, asked.width_cap, asked.runner) == (IDENTICAL, 7, "")
    swapped = _verify_choice(checks, FASTEST, "fastest runs the target with llama-server's settings")
    assert swapped.mode == FASTEST and swapped.runner.startswith("fastest runs")
    assert _verify_choice(None, FASTEST, "x") == VerifyChoice()  # nothing offered before the figures are in
