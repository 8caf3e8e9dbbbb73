"""Live statistics: the numbers panel, the break-even meter, and the data behind the two plots."""
from __future__ import annotations

import pandas as pd

from app.views.render import CACHE_LABELS, esc
from engine.events import CacheEvent, DraftCut, StatsEvent

SERVED = ("exact", "cached")  # cache outcomes where no model runs
METER_MAX = 3.0  # the meter spans 0x .. 3x the target-only speed
SERIES_COLORS = {"theory": "#6366f1", "measured": "#16a34a", "break-even": "#ef4444"}  # stable names, stable colours


def theoretical_speedup(stats: StatsEvent, k: int) -> float | None:
    """The cost model's expected speedup over target-only at draft length k, for the measured acceptance and
    the fitted step costs (the same model the adaptive k maximises: engine.costs.costmodel)."""
    costs = stats.costs
    return None if costs is None else costs.speedup(stats.acceptance.alpha, k)


def speedup(stats: StatsEvent | None, baseline: dict | None) -> float | None:
    """This answer's decode rate over the target-only decode rate measured on this machine (app/baseline.py): the
    same measure on both sides, so neither the prefill nor the UI's delivery enters it. None until the answer has a
    decode rate (two tokens)."""
    if stats is None or not baseline or not baseline.get("decode_tokens_per_s"):
        return None
    mine = stats.decode_tokens_per_s
    return None if mine is None else mine / baseline["decode_tokens_per_s"]


def format_stats(stats: StatsEvent | None) -> dict[str, str]:
    """The displayed values, as strings (tested directly)."""
    if stats is None:
        return dict.fromkeys(("tokens/s", "decode tok/s", "acceptance", "mean accepted", "k", "steps", "tokens"), "–")
    costs, decode = stats.costs, stats.decode_tokens_per_s
    return {
        "tokens/s": f"{stats.tokens_per_s:.1f}",  # end to end: the answer's tokens over its seconds, prefill counted
        "decode tok/s": "–" if decode is None else f"{decode:.1f}",  # after the first token
        "acceptance": f"{stats.acceptance.acceptance_rate:.0%}" if stats.acceptance.proposed else "–",
        "mean accepted": f"{stats.acceptance.mean_accepted:.2f}",
        "k": f"{stats.k}" + (" (fallback)" if stats.fallback else ""),
        "steps": f"{stats.acceptance.steps}",
        "tokens": f"{stats.new_tokens}",
        "verify ms": "–" if costs is None else
        f"{costs.verify_fixed_s * 1e3:.0f} + {costs.verify_per_token_s * 1e3:.0f}·n",
        "draft ms/token": "–" if costs is None else f"{costs.draft_per_token_s * 1e3:.0f}",
    }


def _card(label: str, value: str, css: str = "") -> str:
    return (f'<div class="stat-card {css}" data-stat="{esc(label)}"><div class="stat-value">{esc(value)}</div>'
            f'<div class="stat-label">{esc(label)}</div></div>')


def _cache_card(cache: CacheEvent | None) -> str:
    outcome = cache.outcome if cache is not None else "none"
    value = outcome if cache is not None else "–"
    title = CACHE_LABELS.get(outcome, "") + (f": {cache.reason}" if cache is not None and cache.reason else "")
    return (f'<div class="stat-card cache-outcome" data-outcome="{esc(outcome)}" title="{esc(title)}">'
            f'<div class="stat-value">{esc(value)}</div><div class="stat-label">cache</div></div>')


def meter_html(factor: float | None, baseline: dict | None, served_from_cache: bool = False,
               predicted: float | None = None) -> str:
    """Break-even meter: the speculative speed as a multiple of the measured target-only speed, with the cost
    model's prediction for the current k beside it."""
    if not baseline:
        return ('<div class="meter-box"><div class="meter-caption">The target-only speed is being measured on this '
                'machine (while the app is idle).</div></div>')
    if served_from_cache:  # no model ran: a speed ratio would be meaningless
        factor = None
    fill = 0.0 if factor is None else min(factor, METER_MAX) / METER_MAX * 100
    state = "none" if factor is None else ("win" if factor >= 1.0 else "lose")
    text = "served from the cache" if served_from_cache else "–" if factor is None else f"{factor:.2f}× target-only"
    if not baseline.get("decode_tokens_per_s"):
        return '<div class="meter-box"><div class="meter-caption">Target-only speed not measured yet.</div></div>'
    how = (f"this answer's decode rate over the target-only decode rate, {baseline['decode_tokens_per_s']:.1f} "
           f"tok/s, measured on this machine: {baseline.get('how', '')}")
    if predicted is not None and not served_from_cache:
        how += f"; cost model at this k: {predicted:.2f}×"
    return (f'<div class="meter-box"><div class="meter-head"><span>Break-even meter</span>'
            f'<span class="meter-value {state}">{esc(text)}</span></div>'
            f'<div class="meter"><div class="meter-fill {state}" style="width:{fill:.1f}%"></div>'
            f'<div class="meter-mark" style="left:{100 / METER_MAX:.2f}%" title="break-even (1×)"></div></div>'
            f'<div class="meter-scale"><span>0×</span><span>1×</span><span>2×</span><span>3×</span></div>'
            f'<div class="meter-caption">{esc(how)}</div></div>')


def render_stats(stats: StatsEvent | None, cache: CacheEvent | None, baseline: dict | None,
                 status: str = "") -> str:
    values = format_stats(stats)
    predicted = None if stats is None else theoretical_speedup(stats, stats.k)
    cards = "".join(_card(label, value) for label, value in values.items())
    status_html = f'<div class="run-status">{esc(status)}</div>' if status else ""
    return (f'<div class="stats-panel" id="stats-panel">{status_html}<div class="stat-grid">{cards}'
            f"{_cache_card(cache)}</div>{sources_html(stats)}{policy_html(stats)}"
            f"{meter_html(speedup(stats, baseline), baseline, cache is not None and cache.outcome in SERVED, predicted)}"
            "</div>")


def policy_html(stats: StatsEvent | None) -> str:
    """Where the k policy held speculation back, and why: free drafts it cut, steps it ran target-only."""
    if stats is None or not (stats.cut_steps or stats.fallback):
        return ""
    said = []
    if stats.cut_steps and stats.latest_cut is not None:
        said.append(f"{stats.cut_steps} of {stats.acceptance.steps} steps cut their free draft; latest: "
                    f"{cut_text(stats.latest_cut)}")
    if stats.fallback:
        said.append(paused_text(stats))
    return f'<div class="policy-note" data-stat="policy">{esc(" · ".join(said))}</div>'


def paused_text(stats: StatsEvent) -> str:
    """Why the draft model is paused, in this machine's measured prices."""
    if stats.waiting:
        return ("speculation waits for this machine's figures (the step costs and the identity check, measured while "
                "the app is idle): target-only steps until they are in")
    costs = stats.costs
    prices = "" if costs is None else (f": on this machine a draft token costs {costs.draft_per_token_s * 1e3:.0f} ms "
                                       f"and verifying one more {costs.verify_per_token_s * 1e3:.0f} ms, against "
                                       f"{(costs.verify_fixed_s + costs.verify_per_token_s) * 1e3:.0f} ms a target "
                                       "step")
    return (f"speculation paused{prices}; at this acceptance its drafts cost more than they save (target-only steps, "
            "with a probe now and then where a draft could pay)")


def sources_html(stats: StatsEvent | None) -> str:
    """Each draft source's share of the acceptance (a prediction, the memory of earlier answers, a lookup, the draft
    model…), when more than one drafted or known text from outside the prompt did."""
    if stats is None or not stats.by_source or (len(stats.by_source) == 1
                                                 and stats.by_source[0][0] not in ("prediction", "memory")):
        return ""
    parts = [f"{name or 'draft'} {a.accepted}/{a.proposed}" for name, a in stats.by_source]
    return f'<div class="sources-note" data-stat="sources">{esc("accepted by source: " + " · ".join(parts))}</div>'


def cut_text(cut: DraftCut) -> str:
    """A free draft the k policy cut, in words: "lookup span cut 9 → 2: verify costs 46 ms per token here"."""
    what = f"cut {cut.drafted} → {cut.kept}" if cut.kept else f"of {cut.drafted} skipped"
    per_token = "" if cut.verify_per_token_s is None else \
        f": verify costs {cut.verify_per_token_s * 1e3:.0f} ms per token here"
    return f"{cut.proposer} span {what}{per_token}"


def _frame(rows: list[dict], dtypes: dict[str, str]) -> pd.DataFrame:
    """Typed even when empty: Gradio picks each axis type (quantitative/nominal) from the column dtypes."""
    return pd.DataFrame(rows, columns=list(dtypes)).astype(dtypes)


def acceptance_frame(stats: StatsEvent | None) -> pd.DataFrame:
    """Acceptance rate at each draft position (1-based): accepted_by_pos / proposed_by_pos."""
    rows = []
    if stats is not None:
        for i, (acc, prop) in enumerate(zip(stats.acceptance.accepted_by_pos, stats.acceptance.proposed_by_pos)):
            if prop:
                # zero-padded: the bar plot orders categories as text ("10" would sort before "2")
                rows.append({"position": f"{i + 1:02d}", "acceptance": acc / prop, "drafts": prop})
    return _frame(rows, {"position": "str", "acceptance": "float64", "drafts": "int64"})


def speedup_frame(stats: StatsEvent | None, baseline: dict | None, k_max: int = 12) -> pd.DataFrame:
    """The cost model's speedup over k (0 = target-only) for the measured α and fitted costs, the measured
    speedup, and break-even (1×)."""
    rows = []
    if stats is not None and stats.costs is not None:
        hi = max(k_max, stats.k + 2)
        rows += [{"k": k, "speedup": theoretical_speedup(stats, k), "series": "theory"} for k in range(hi + 1)]
        measured = speedup(stats, baseline)
        if measured is not None:
            rows += [{"k": k, "speedup": measured, "series": "measured"} for k in (0, hi)]
        rows += [{"k": k, "speedup": 1.0, "series": "break-even"} for k in (0, hi)]
    return _frame(rows, {"k": "int64", "speedup": "float64", "series": "str"})
