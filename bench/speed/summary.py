"""The bench's summary and table: per mode, its speed against ``target`` on the same prompts, and its divergences.

With repeats, the speed of a (prompt, mode) is its median run by seconds (for an even count, the faster of the
middle two); identity and divergences count every run."""
from __future__ import annotations

import math
import statistics
from collections import defaultdict


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def median_runs(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """{(prompt id, mode): its median run by seconds}."""
    by_key = defaultdict(list)
    for r in runs:
        by_key[r["id"], r["mode"]].append(r)
    return {key: sorted(mine, key=lambda r: r["seconds"])[(len(mine) - 1) // 2] for key, mine in by_key.items()}


def _decode(runs: list[dict]) -> float | None:
    """Decode tokens over decode seconds, summed over the runs that have a decode rate."""
    timed = [r for r in runs if r.get("decode_tokens_per_s")]
    seconds = sum((r["new_tokens"] - 1) / r["decode_tokens_per_s"] for r in timed)
    return sum(r["new_tokens"] - 1 for r in timed) / seconds if seconds else None


def _timing(mine: list[dict], target: dict[str, dict]) -> dict:
    """Time to first token and decode rate of a mode's median runs, the decode rate also against ``target``'s on
    the same prompt (or the mode's own target-only baseline: cache-verify's on the paraphrase)."""
    ttfts = [r["ttft_s"] for r in mine if r.get("ttft_s") is not None]
    ratios = []
    for r in mine:
        base = r.get("baseline_decode_tokens_per_s") or target[r["id"]].get("decode_tokens_per_s")
        if r.get("decode_tokens_per_s") and base:
            ratios.append(r["decode_tokens_per_s"] / base)
    return {"ttft_median_s": statistics.median(ttfts) if ttfts else None, "decode_tokens_per_s": _decode(mine),
            "decode_vs_target_geomean": _geomean(ratios) if ratios else None}


def summarize(runs: list[dict], modes: list[str]) -> dict:
    """Per mode: speedup over ``target`` on the same prompt (tokens/s ratio of the median runs), overall and per
    kind; time to first token and decode rate.

    A mode with its own ``baseline_tokens_per_s`` (cache-verify: target-only on the paraphrase) uses that."""
    medians = median_runs(runs)
    target = {pid: r for (pid, mode), r in medians.items() if mode == "target"}
    summary = {}
    for mode in modes:
        mine = [r for (pid, m), r in medians.items() if m == mode and pid in target]
        speedups = [r["tokens_per_s"] / (r.get("baseline_tokens_per_s") or target[r["id"]]["tokens_per_s"])
                    for r in mine]
        by_kind = defaultdict(list)
        for r, s in zip(mine, speedups):
            by_kind[r["kind"]].append(s)
        every = [r for r in runs if r["mode"] == mode and r["id"] in target]
        identical = [r["identical_to_target"] for r in every if r["identical_to_target"] is not None]
        seconds = sum(r["seconds"] for r in mine)
        summary[mode] = {"speedup_geomean": _geomean(speedups), "speedup_min": min(speedups, default=float("nan")),
                         "tokens_per_s": sum(r["new_tokens"] for r in mine) / seconds if seconds else float("nan"),
                         **_timing(mine, target),
                         "identical_fraction": sum(identical) / len(identical) if identical else None,
                         "by_kind": {k: _geomean(v) for k, v in sorted(by_kind.items())},
                         "divergences": _first_divergences(every)}
    return summary


def _first_divergences(runs: list[dict]) -> dict[str, dict]:
    """{prompt id: the first divergence of its first run that diverged}."""
    found = {}
    for r in runs:
        if r.get("first_divergence"):
            found.setdefault(r["id"], r["first_divergence"])
    return found


def _cell(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def _state_line(header: dict) -> str:
    state = ("warm: each run's prompt already in the mode's own state (a follow-up turn)" if header.get("warm")
             else "fresh: each run starts from the state a new request finds")
    repeats = header.get("repeats", 1)
    return f"{state}; {repeats} run(s) per prompt and mode" + (", median run summarized" if repeats > 1 else "")


def _run_line(r: dict) -> str:
    same = "" if r["identical_to_target"] is None else ("yes" if r["identical_to_target"] else "NO")
    return (f"{r['id']:<24} {r['mode']:<14} {r.get('repeat', 0):>3} {r['new_tokens']:>6} {r['seconds']:>7.2f} "
            f"{r['tokens_per_s']:>7.2f} {_cell(r.get('ttft_s'), '.3f'):>7} "
            f"{_cell(r.get('decode_tokens_per_s'), '.2f'):>7} {_cell(r['acceptance_rate'], '.2f'):>7} {same:>5}")


def _mode_line(mode: str, s: dict) -> str:
    kinds = "  ".join(f"{k}={v:.2f}x" for k, v in s["by_kind"].items())
    ident = "" if s["identical_fraction"] is None else f" identical={s['identical_fraction']:.2f}"
    ttft = "n/a" if s.get("ttft_median_s") is None else f"{s['ttft_median_s']:.3f}s"
    decode = "n/a" if s.get("decode_tokens_per_s") is None else f"{s['decode_tokens_per_s']:.2f} tok/s"
    if s.get("decode_vs_target_geomean") is not None:
        decode += f" ({s['decode_vs_target_geomean']:.2f}× target)"
    return (f"{mode:<14} {s['tokens_per_s']:6.2f} tok/s  speedup geomean={s['speedup_geomean']:.2f}x "
            f"min={s['speedup_min']:.2f}x{ident}  ttft median={ttft} decode={decode}  by kind: {kinds}")


def format_table(result: dict) -> str:
    lines = [_state_line(result.get("header", {})),
             f"{'id':<24} {'mode':<14} {'rep':>3} {'tokens':>6} {'s':>7} {'tok/s':>7} {'ttft':>7} {'decode':>7} "
             f"{'accept':>7} {'same':>5}"]
    lines += [_run_line(r) for r in result["runs"]]
    lines.append("")
    for mode, s in result["summary"].items():
        lines.append(_mode_line(mode, s))
        for pid, div in s["divergences"].items():
            tie = "a tie within rounding" if div["within_rounding"] else "NOT within rounding: a bug"
            lines.append(f"{'':<14}   {pid}: first divergence at token {div['position']}, top-2 margin "
                         f"{div['top2_margin']:.3f} (rounding step {div['rounding_step']:.3f}: {tie})")
    return "\n".join(lines)
