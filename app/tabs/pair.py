"""The model panel at the top of the left column: pick and load a target/draft pair, with progress, and
re-measure the target-only speed. A failed load leaves the previous pair in place."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app import toast
from app.context import AppContext
from app.settings import model_choices
from app.tabs.engine_queue import ENGINE
from app.views.render import error_html, error_message, esc
from app.views.stats import render_stats
from engine.config import AUTO, PRECISIONS, VERIFY_MODES
from engine.errors import EngineError
from engine.surface import PairInfo

PRECISION_CHOICES = list(PRECISIONS)  # "auto" first: the measured fastest for this machine


@dataclass(frozen=True)
class PairPanel:
    target: gr.Dropdown
    target_precision: gr.Radio
    draft: gr.Dropdown
    draft_precision: gr.Radio
    load: gr.Button
    remeasure: gr.Button
    verify: gr.Radio
    status: gr.HTML


def create(pair: PairInfo | None) -> PairPanel:
    choices = model_choices()
    target = pair.target if pair else (choices[0] if choices else "")
    draft = pair.draft if pair else (choices[-1] if choices else "")
    target_box = gr.Dropdown(choices, value=target, label="Target model", allow_custom_value=True,
                             info="built-in name, HF id, local path or .gguf", elem_id="target")
    target_prec = gr.Radio(PRECISION_CHOICES, value=pair.target_precision if pair else AUTO,
                           show_label=False, elem_id="target-precision", elem_classes=["precision"])
    draft_box = gr.Dropdown(choices, value=draft, label="Draft model", allow_custom_value=True, elem_id="draft")
    draft_prec = gr.Radio(PRECISION_CHOICES, value=pair.draft_precision if pair else AUTO,
                          show_label=False, elem_id="draft-precision", elem_classes=["precision"])
    with gr.Row():
        load = gr.Button("Load pair", variant="primary", elem_id="load-pair", scale=1, min_width=90)
        remeasure = gr.Button("Re-measure", elem_id="remeasure", scale=1, min_width=90)
    verify = gr.Radio(list(VERIFY_MODES), value=(pair.verify_mode or None) if pair else None, label="Verify widths",
                      info="identical: an adaptive k keeps to the widest verify measured bit-identical; fastest: "
                           "up to k 16 (each priced on the pair line)", elem_id="verify-mode")
    status = gr.HTML(elem_id="pair-status")
    return PairPanel(target=target_box, target_precision=target_prec, draft=draft_box, draft_precision=draft_prec,
                     load=load, remeasure=remeasure, verify=verify, status=status)


def pair_status_html(pair: PairInfo | None, baseline: dict | None = None, note: str = "") -> str:
    if pair is None:
        body = "No pair loaded yet."
    else:
        body = (f'<b>target</b> {esc(pair.target)} <span class="prec">{esc(pair.target_precision)}</span>'
                f' · <b>draft</b> {esc(pair.draft)} <span class="prec">{esc(pair.draft_precision)}</span>'
                f' · {esc(pair.device)}' + (f' · {esc(pair.runner)}' if pair.runner else ""))
        if baseline:
            body += (f' · target-only {baseline["decode_tokens_per_s"]:.1f} tok/s decoding, '
                     f'{baseline["tokens_per_s"]:.1f} end to end')
        if pair.precision_note:
            body += f'<div class="precision-note">{esc(pair.precision_note)}</div>'
        if pair.identity_note:
            body += f'<div class="identity-note">{esc(pair.identity_note)}</div>'
        if pair.verify_note:
            body += (f'<div class="verify-note"><b>{esc(pair.verify_mode)}</b> · {esc(pair.verify_note)}</div>')
    extra = f'<div class="pair-note">{esc(note)}</div>' if note else ""
    return f'<div class="pair-status">{body}{extra}</div>'


def _precision(value: str | None) -> str | None:
    return None if not value or value == AUTO else value


def make_pair_handlers(ctx: AppContext, panel: PairPanel, error_box, stats) -> dict:
    """``error_box`` and ``stats`` are the chat tab's: a load says its failure there and resets the meter."""
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
            return {panel.status: pair_status_html(ctx.pair(), ctx.baseline(), note),
                    error_box: error_html(f"Could not load the pair: {message}")}
        progress(0.85, desc="Measuring the target-only speed (once per target and precision)…")
        baseline = ctx.ensure_baseline()
        toast.info("Pair loaded.")
        pair = ctx.pair()
        return {panel.status: pair_status_html(pair, baseline), error_box: error_html(None),
                stats: render_stats(None, None, baseline), panel.verify: (pair.verify_mode or None) if pair else None}

    def remeasure(progress=gr.Progress()):
        if ctx.pair() is None:
            return {error_box: error_html("load a pair first")}
        progress(0.1, desc="Measuring the target-only speed…")
        baseline = ctx.ensure_baseline(remeasure=True)
        return {panel.status: pair_status_html(ctx.pair(), baseline), stats: render_stats(None, None, baseline)}

    def verify(mode: str | None):
        if ctx.pair() is None or not mode:
            return {error_box: error_html("load a pair first" if ctx.pair() is None else None)}
        try:
            info = ctx.engine.set_verify_mode(mode)
        except EngineError as err:  # a pair with no choice, or an unknown mode: the pair stays as it was
            toast.warn(error_message(err))
            return {error_box: error_html(error_message(err)),
                    panel.status: pair_status_html(ctx.pair(), ctx.baseline())}
        return {panel.status: pair_status_html(info, ctx.baseline()), error_box: error_html(None)}

    return dict(load=load, remeasure=remeasure, verify=verify)


def wire(ctx: AppContext, panel: PairPanel, error_box, stats) -> None:
    h = make_pair_handlers(ctx, panel, error_box, stats)
    inputs = [panel.target, panel.target_precision, panel.draft, panel.draft_precision]
    outputs = [panel.status, error_box, stats]
    panel.load.click(h["load"], inputs, [*outputs, panel.verify], api_name="load_pair", **ENGINE)
    panel.remeasure.click(h["remeasure"], None, outputs, api_name="measure_baseline", **ENGINE)
    panel.verify.input(h["verify"], [panel.verify], [panel.status, error_box], api_name="set_verify_mode", **ENGINE)
