"""The bench's summary and table: ratios within one run, and divergences reported with their margin."""
from bench.speed.modes import format_table, summarize
from engine.divergence import Divergence
from engine.precision import rounding_step


def run(pid: str, mode: str, tokens_per_s: float, divergence: Divergence | None = None) -> dict:
    return {"id": pid, "kind": "code", "mode": mode, "new_tokens": 10, "seconds": 10 / tokens_per_s,
            "tokens_per_s": tokens_per_s, "acceptance_rate": None if mode == "target" else 0.8,
            "identical_to_target": None if mode == "target" else divergence is None,
            "first_divergence": divergence.to_dict() if divergence else None}


def test_summary_ratios_and_a_divergence_in_the_table():
    tie = Divergence(position=6, reference_token=1, other_token=2, reference_text=" n", other_text=" x",
                     top_logit=20.0, top2_margin=0.125, tokens_gap=0.125, precision="int8-weight",
                     rounding_step=rounding_step("int8-weight", 20.0))
    runs = [run("a", "target", 5.0), run("a", "default", 10.0), run("b", "target", 4.0),
            run("b", "default", 2.0, tie)]
    summary = summarize(runs, ["target", "default"])
    assert summary["default"]["speedup_min"] == 0.5 and abs(summary["default"]["speedup_geomean"] - 1.0) < 1e-9
    assert summary["default"]["identical_fraction"] == 0.5
    table = format_table({"runs": runs, "summary": summary})
    assert "b: first divergence at token 6, top-2 margin 0.125 (rounding step 0.125: a tie within rounding)" in table
