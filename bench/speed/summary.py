"""The bench's summary and table: per mode, its speed against ``target`` on the same prompts, and its divergences."""
from __future__ import annotations

import math
from collections import defaultdict


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def summarize(runs: list[dict], modes: list[str]) -> dict:
    """Per mode: speedup over ``target`` on the same prompt (tokens/s ratio), overall and per kind.

    A mode with its own ``baseline_tokens_per_s`` (cache-verify: target-only on the paraphrase) uses that."""
    target_tps = {r["id"]: r["tokens_per_s"] for r in runs if r["mode"] == "target"}
    summary = {}
    for mode in modes:
        mine = [r for r in runs if r["mode"] == mode and r["id"] in target_tps]
        speedups = [r["tokens_per_s"] / (r.get("baseline_tokens_per_s") or target_tps[r["id"]]) for r in mine]
        by_kind = defaultdict(list)
        for r, s in zip(mine, speedups):
            by_kind[r["kind"]].append(s)
        identical = [r["identical_to_target"] for r in mine if r["identical_to_target"] is not None]
        seconds = sum(r["seconds"] for r in mine)
        summary[mode] = {"speedup_geomean": _geomean(speedups), "speedup_min": min(speedups, default=float("nan")),
                         "tokens_per_s": sum(r["new_tokens"] for r in mine) / seconds if seconds else float("nan"),
                         "identical_fraction": sum(identical) / len(identical) if identical else None,
                         "by_kind": {k: _geomean(v) for k, v in sorted(by_kind.items())},
                         "divergences": {r["id"]: r["first_divergence"] for r in mine if r.get("first_divergence")}}
    return summary


def format_table(result: dict) -> str:
    lines = [f"{'id':<24} {'mode':<14} {'tokens':>6} {'s':>7} {'tok/s':>7} {'accept':>7} {'same':>5}"]
    for r in result["runs"]:
        acc = "" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.2f}"
        same = "" if r["identical_to_target"] is None else ("yes" if r["identical_to_target"] else "NO")
        lines.append(f"{r['id']:<24} {r['mode']:<14} {r['new_tokens']:>6} {r['seconds']:>7.2f} "
                     f"{r['tokens_per_s']:>7.2f} {acc:>7} {same:>5}")
    lines.append("")
    for mode, s in result["summary"].items():
        kinds = "  ".join(f"{k}={v:.2f}x" for k, v in s["by_kind"].items())
        ident = "" if s["identical_fraction"] is None else f" identical={s['identical_fraction']:.2f}"
        lines.append(f"{mode:<14} {s['tokens_per_s']:6.2f} tok/s  speedup geomean={s['speedup_geomean']:.2f}x "
                     f"min={s['speedup_min']:.2f}x{ident}  by kind: {kinds}")
        for pid, div in s["divergences"].items():
            tie = "a tie within rounding" if div["within_rounding"] else "NOT within rounding: a bug"
            lines.append(f"{'':<14}   {pid}: first divergence at token {div['position']}, top-2 margin "
                         f"{div['top2_margin']:.3f} (rounding step {div['rounding_step']:.3f}: {tie})")
    return "\n".join(lines)
