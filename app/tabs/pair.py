"""Loading a target/draft pair from the UI, with progress; a failure leaves the previous pair in place."""
from __future__ import annotations

import gradio as gr

from app import toast
from app.context import AppContext
from app.views.render import error_html, error_message, esc
from app.views.stats import render_stats
from engine.config import AUTO
from engine.errors import EngineError


def pair_status_html(pair: dict | None, baseline: dict | None = None, note: str = "") -> str:
    if pair is None:
        body = "No pair loaded yet."
    else:
        body = (f'<b>target</b> {esc(pair["target"])} <span class="prec">{esc(pair["target_precision"])}</span>'
                f' · <b>draft</b> {esc(pair["draft"])} <span class="prec">{esc(pair["draft_precision"])}</span>'
                f' · {esc(pair["device"])}')
        if baseline:
            body += f' · target-only {baseline["tokens_per_s"]:.1f} tok/s'
        if pair.get("precision_note"):
            body += f'<div class="precision-note">{esc(pair["precision_note"])}</div>'
    extra = f'<div class="pair-note">{esc(note)}</div>' if note else ""
    return f'<div class="pair-status">{body}{extra}</div>'


def _precision(value: str | None) -> str | None:
    return None if not value or value == AUTO else value


def make_pair_handlers(ctx: AppContext, elems: dict) -> dict:
    def load(target: str, target_precision: str, draft: str, draft_precision: str,
             progress=gr.Progress(track_tqdm=True)):
        progress(0.05, desc=f"Loading {target} and {draft}…")
        try:
            ctx.engine.load_pair((target or "").strip(), (draft or "").strip(),
                                 _precision(target_precision), _precision(draft_precision))
        except (EngineError, OSError) as err:  # a bad name or pair, a failed download, a full disk: the old pair stays
            message = error_message(err)
            toast.warn(f"Could not load the pair: {message}")
            note = "The previous pair is still loaded." if ctx.pair() else ""
            return {elems["pair_status"]: pair_status_html(ctx.pair(), ctx.baseline(), note),
                    elems["error_box"]: error_html(f"Could not load the pair: {message}")}
        progress(0.85, desc="Measuring the target-only speed (once per target and precision)…")
        baseline = ctx.ensure_baseline()
        toast.info("Pair loaded.")
        return {elems["pair_status"]: pair_status_html(ctx.pair(), baseline),
                elems["error_box"]: error_html(None),
                elems["stats"]: render_stats(None, None, baseline)}

    def remeasure(progress=gr.Progress()):
        if ctx.pair() is None:
            return {elems["error_box"]: error_html("load a pair first")}
        progress(0.1, desc="Measuring the target-only speed…")
        baseline = ctx.ensure_baseline(remeasure=True)
        return {elems["pair_status"]: pair_status_html(ctx.pair(), baseline),
                elems["stats"]: render_stats(None, None, baseline)}

    return dict(load=load, remeasure=remeasure)
