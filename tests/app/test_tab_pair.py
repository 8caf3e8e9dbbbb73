"""app/tabs/pair.py: the identical/fastest choice, with what each costs, on the pair line; a refused choice leaves
the pair as it was. The race claims bit-identity in identical mode for an adaptive k only."""
import gradio as gr

from app.baseline import BaselineStore
from app.context import AppContext
from app.tabs.pair import create, make_pair_handlers, pair_status_html
from app.tabs.race import claims_identity
from engine.config import SpecConfig
from engine.surface import PairInfo
from tests.helpers.fakes import SCRIPT, FakeEngine


def _handlers(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    with gr.Blocks():
        panel = create(ctx.pair())
        error_box, stats = gr.HTML(), gr.HTML()
    return ctx, panel, error_box, make_pair_handlers(ctx, panel, error_box, stats)


def test_choosing_fastest_switches_the_engine_and_the_pair_line_says_it_escaped(tmp_path):
    ctx, panel, error_box, h = _handlers(tmp_path)
    assert panel.verify.value == "identical"  # the engine's measured default
    out = h["verify"]("fastest")
    assert ctx.engine.calls[-1] == {"verify": "fastest"} and ctx.pair().verify_mode == "fastest"
    status = out[panel.status]
    assert "<b>fastest</b>" in status and SCRIPT not in status and "&lt;script&gt;" in status


def test_an_unknown_mode_is_refused_with_a_message_and_the_pair_stays(tmp_path):
    ctx, panel, error_box, h = _handlers(tmp_path)
    out = h["verify"]("sideways")
    assert "verify mode must be one of identical, fastest" in out[error_box]
    assert ctx.pair().verify_mode == "identical"


def test_a_pair_without_a_choice_shows_no_verify_line():
    plain = PairInfo("t", "d", "gguf", "gguf", "cpu", identity_note="verified bit-identical on this machine")
    assert "verify-note" not in pair_status_html(plain)


def test_the_race_claims_identity_in_identical_mode_only_for_an_adaptive_k():
    capped = PairInfo("t", "d", "gguf", "gguf", "cpu", verify_mode="identical", verify_note="…")
    assert claims_identity(capped, SpecConfig(adaptive=True))
    assert not claims_identity(capped, SpecConfig(k=10))
    assert not claims_identity(PairInfo("t", "d", "gguf", "gguf", "cpu", verify_mode="fastest"), SpecConfig(adaptive=True))
    assert claims_identity(PairInfo("t", "d", "gguf", "gguf", "cpu", bit_identical=True), SpecConfig(k=10))
    assert not claims_identity(None, SpecConfig())
