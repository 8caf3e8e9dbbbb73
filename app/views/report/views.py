"""An experiment's views: the table, speedup against k beside the cost model, acceptance by draft position,
progress and the pair doctor. Input is the engine's plain rows (engine/lab/results.py); output is escaped HTML
or a DataFrame, the same pieces in the tab and in the saved report."""
from __future__ import annotations

from collections import defaultdict
from html import escape

import pandas as pd

from app.views.report.svg_chart import PALETTE, Series, legend, line_chart
from engine.config import FREE_PROPOSERS
from engine.surface import COLUMNS, StepCosts

HEADERS = {"cell": "cell", "prompt_set": "set", "k": "k", "temperature": "T", "proposer": "proposer",
           "draft": "draft", "draft_precision": "draft prec.", "target_precision": "target prec.",
           "tokens_per_s": "tok/s", "baseline_tokens_per_s": "target-only tok/s", "speedup": "speedup",
           "predicted_speedup": "predicted", "acceptance": "acceptance", "alpha": "α", "mean_accepted": "mean accepted",
           "identical": "identical to target", "distribution_p": "follows target (p)", "new_tokens": "tokens",
           "command": "reproduce"}
TABLE_COLUMNS = tuple(c for c in COLUMNS if c not in ("cell", "command"))


def _fmt(column: str, value) -> str:
    if value is None:
        return "–"
    if column in ("tokens_per_s", "baseline_tokens_per_s"):
        return f"{value:.1f}"
    if column in ("speedup", "predicted_speedup"):
        return f"{value:.2f}×"
    if column in ("acceptance", "alpha"):
        return f"{value:.0%}"
    if column == "mean_accepted":
        return f"{value:.2f}"
    if column == "distribution_p":
        return f"{'✓' if value >= 0.01 else '✗'} {value:.2f}"
    if column == "temperature":
        return f"{value:g}"
    return str(value)


def cell_text(row: dict, column: str) -> str:
    """One table cell as text; a precision chosen as ``auto`` shows what it resolved to."""
    text = _fmt(column, row.get(column))
    used = row.get(f"{column}_used")
    return f"{text} → {used}" if used and used != row.get(column) else text


def table_frame(rows: list[dict]) -> pd.DataFrame:
    """The table as text cells (Gradio's Dataframe escapes them)."""
    data = [[cell_text(r, c) for c in TABLE_COLUMNS] for r in rows]
    return pd.DataFrame(data, columns=[HEADERS[c] for c in TABLE_COLUMNS])


def _x(row: dict) -> float:
    return row["mean_k"] if row["k"] == "adaptive" else row["k"]


def series_alpha(rows: list[dict]) -> float:
    """The series' per-token acceptance, pooled over its cells (weighted by tokens)."""
    weight = sum(r["new_tokens"] for r in rows)
    return sum(r["alpha"] * r["new_tokens"] for r in rows) / weight if weight else 0.0


def predicted_curve(rows: list[dict], ks: list[int]) -> list[tuple[float, float]]:
    """engine.costs.costmodel's speedup for the series' measured alpha, at each k."""
    c = rows[0]["costs"]
    costs = StepCosts(c["verify_fixed_s"], c["verify_per_token_s"],
                      0.0 if rows[0]["proposer"] in FREE_PROPOSERS else c["draft_per_token_s"])
    alpha = series_alpha(rows)
    return [(k, costs.speedup(alpha, k)) for k in ks]


def speedup_chart(rows: list[dict]) -> str:
    """Measured speedup per cell (dots; adaptive k as squares at its mean k) and, per series, the predicted curve."""
    if not rows:
        return '<div class="lab-empty">Speedup against k appears here as cells finish.</div>'
    groups = defaultdict(list)
    for r in rows:
        groups[r["series"]].append(r)
    k_max = max(8, *(int(-(-_x(r) // 1)) for r in rows))
    ks = list(range(1, k_max + 1))
    series, items = [], []
    for i, (name, members) in enumerate(groups.items()):
        color = PALETTE[i % len(PALETTE)]
        alpha = series_alpha(members)
        series.append(Series(f"predicted · {name} (α = {alpha:.2f})", predicted_curve(members, ks),
                             "predicted-curve", color, dashed=True, data={"alpha": f"{alpha:.3f}"}))
        fixed = [(_x(r), r["speedup"]) for r in members if r["k"] != "adaptive"]
        adaptive = [(_x(r), r["speedup"]) for r in members if r["k"] == "adaptive"]
        if fixed:
            series.append(Series(f"measured · {name}", fixed, "measured-point", color, line=False))
        if adaptive:
            series.append(Series(f"measured · {name} · adaptive k (at its mean k)", adaptive, "measured-point adaptive",
                                 color, line=False, marker="square"))
        items += [(color, f"{name}: measured", "dot"), (color, f"predicted for α = {alpha:.2f}", "dashed")]
    chart = line_chart(series, x_label="k (draft length)", y_label="speedup over target-only", x_range=(1, k_max),
                       hline=1.0, chart_id="lab-speedup-svg")
    return f'<div class="lab-plot" id="lab-speedup">{chart}{legend(items)}</div>'


def acceptance_chart(rows: list[dict]) -> str:
    """Acceptance rate at each draft position, one line per cell."""
    rows = [r for r in rows if r["acceptance_by_position"]]
    if not rows:
        return '<div class="lab-empty">Acceptance by draft position appears here as cells finish.</div>'
    width = max(len(r["acceptance_by_position"]) for r in rows)
    series, items = [], []
    for i, r in enumerate(rows):
        color = PALETTE[i % len(PALETTE)]
        points = [(pos + 1, rate) for pos, rate in enumerate(r["acceptance_by_position"]) if rate is not None]
        series.append(Series(r["cell"], points, "accept-line", color, line=len(points) > 1))
        items.append((color, r["cell"], "line"))
    chart = line_chart(series, x_label="draft position", y_label="acceptance", x_range=(1, max(width, 2)),
                       y_max=1.0, chart_id="lab-accept-svg")
    return f'<div class="lab-plot" id="lab-accept">{chart}{legend(items)}</div>'


def progress_html(done: int, total: int, message: str, loading: bool = False) -> str:
    pct = 100 * done / total if total else 0
    note = ' class="lab-loading"' if loading else ""
    return (f'<div class="lab-progress"><progress max="{total}" value="{done}"></progress> '
            f'<span class="lab-count">{done}/{total} ({pct:.0f}%)</span> <span{note}>{escape(message)}</span></div>')


def _table(head: list[str], body: list[list[str]], css: str) -> str:
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in body)
    return f'<table class="{css}"><thead><tr>{th}</tr></thead><tbody>{tr}</tbody></table>'


def _measured(rows: list[dict], kind: str, k: int) -> str:
    hits = [r["speedup"] for r in rows if r["prompt_set"] == kind and r["k"] == k and r["temperature"] == 0
            and r["proposer"] == "draft" and r["speedup"] is not None]
    return f"{hits[0]:.2f}×" if hits else "–"


def doctor_html(report: dict | None, rows: list[dict] | None = None) -> str:
    """The pair doctor's report; with a run's rows, its measured speedup beside each prediction (greedy, draft)."""
    if not report:
        return ""
    rows = rows or []
    ok = '<span class="race-ok">✓</span>'
    bad = '<span class="race-bad">✗</span>'
    vocab = f"{ok if report['vocab_same'] else bad} vocabulary: {report['vocab_sizes'][0]} / {report['vocab_sizes'][1]}"
    template = f"{ok if report['template_same'] else bad} {escape(report['template_note'])}"
    memory = _table(["precision", "target GB", "draft GB"],
                    [[escape(p), f"{m['target']:.2f}", f"{m['draft']:.2f}"] for p, m in report["memory_gb"].items()],
                    "lab-doctor-memory")
    kv = report["kv_mb_per_1k_tokens"]
    verify = ", ".join(f"n={n}: {s * 1e3:.1f} ms" for n, s in report["t_verify_s"].items())
    c = report["costs"]
    breakeven = _table(["k", *[str(k) for k in report["break_even"]]],
                       [["break-even α", *["never" if a is None else f"{a:.2f}" for a in report["break_even"].values()]]],
                       "lab-doctor-breakeven")
    probe_rows = []
    for kind, p in report["probes"].items():
        best = p["best_k"]
        predicted = {int(k): v for k, v in p["predicted"].items()}  # JSON keys are strings
        probe_rows.append([escape(kind), f"{p['alpha']:.2f}", str(best), f"{predicted[best]:.2f}×",
                           _measured(rows, kind, best),
                           " · ".join(f"k={k}: {v:.2f}× / {_measured(rows, kind, k)}"
                                      for k, v in predicted.items() if k in (2, 4, 8))])
    probes = _table(["kind", "probe α", "best k", "predicted", "measured", "k = 2 / 4 / 8 (predicted / measured)"],
                    probe_rows, "lab-doctor-probes")
    return (f'<div class="lab-doctor" id="lab-doctor-report"><h4>Pair doctor: {escape(report["target"])} '
            f'({escape(report["target_precision"])}) with draft {escape(report["draft"])} '
            f'({escape(report["draft_precision"])})</h4><p>{vocab}<br>{template}</p>'
            f"<p>Weights (estimate, KV cache extra: {kv['target']:.0f} / {kv['draft']:.0f} MB per 1000 tokens)</p>"
            f"{memory}<p>t_draft = {report['t_draft_s'] * 1e3:.1f} ms per token · t_verify: {verify} · fitted "
            f"{c['verify_fixed_s'] * 1e3:.1f} + {c['verify_per_token_s'] * 1e3:.2f}·n ms</p>{breakeven}"
            f"<p>Predicted speedup per prompt kind (greedy, draft model, from a {PROBE_NOTE}); measured: the last "
            f"run's greedy draft cell of that kind and k.</p>{probes}</div>")


PROBE_NOTE = "3-prompt acceptance probe per kind"
