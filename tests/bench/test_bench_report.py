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


def timed(pid: str, mode: str, seconds: float, ttft_s: float | None, repeat: int, new_tokens: int = 11) -> dict:
    decode = None if ttft_s is None else (new_tokens - 1) / (seconds - ttft_s)
    return {"id": pid, "kind": "code", "mode": mode, "repeat": repeat, "new_tokens": new_tokens, "seconds": seconds,
            "tokens_per_s": new_tokens / seconds, "ttft_s": ttft_s, "decode_tokens_per_s": decode,
            "acceptance_rate": None, "identical_to_target": None if mode == "target" else True}


def test_the_summary_takes_each_prompts_median_run_by_seconds():
    """Three repeats: the median by seconds is the middle run; its tok/s, ttft and decode rate are the ones
    summarized (the slowest and the fastest run change nothing). Decode tok/s sums decode tokens over decode
    seconds; its ratio to target is a geomean per prompt; identity counts every run."""
    runs = [timed("a", "target", 3.0, 1.0, 0), timed("a", "target", 9.0, 8.0, 1), timed("a", "target", 2.5, 0.1, 2),
            timed("a", "spec", 2.0, 1.0, 0), timed("a", "spec", 1.0, 0.5, 1), timed("a", "spec", 60.0, None, 2),
            timed("b", "target", 6.0, 1.0, 0), timed("b", "spec", 4.0, 2.0, 0)]
    runs[5]["identical_to_target"] = False
    summary = summarize(runs, ["target", "spec"])
    target, spec = summary["target"], summary["spec"]
    # medians: a/target 3.0 s (ttft 1.0, decode 10 / 2), a/spec 2.0 s (ttft 1.0, decode 10 / 1); b one run each
    assert target["tokens_per_s"] == 22 / 9.0 and spec["tokens_per_s"] == 22 / 6.0
    assert target["ttft_median_s"] == 1.0 and spec["ttft_median_s"] == 1.5
    assert target["decode_tokens_per_s"] == 20 / 7.0 and spec["decode_tokens_per_s"] == 20 / 3.0
    assert abs(spec["decode_vs_target_geomean"] - (2.0 * 2.5) ** 0.5) < 1e-9  # a: 10/5 = 2.0, b: 5/2 = 2.5
    assert abs(spec["speedup_geomean"] - (1.5 * 1.5) ** 0.5) < 1e-9
    assert spec["identical_fraction"] == 3 / 4
    table = format_table({"runs": runs, "summary": summary, "header": {"warm": True, "repeats": 3}})
    assert table.splitlines()[0].startswith("warm: ") and "3 run(s) per prompt and mode, median run" in table
    assert table.splitlines()[1].split() == ["id", "mode", "rep", "tokens", "s", "tok/s", "ttft", "decode", "accept",
                                             "same"]
    assert "ttft median=1.500s decode=6.67 tok/s (2.24× target)" in table


def test_an_even_number_of_runs_takes_the_faster_middle_one_and_no_ttft_reads_na():
    runs = [timed("a", "target", 4.0, None, 0, new_tokens=1), timed("a", "target", 2.0, None, 1, new_tokens=1)]
    summary = summarize(runs, ["target"])
    assert summary["target"]["tokens_per_s"] == 0.5
    assert summary["target"]["ttft_median_s"] is None and summary["target"]["decode_tokens_per_s"] is None
    assert "ttft median=n/a decode=n/a" in format_table({"runs": runs, "summary": summary})
