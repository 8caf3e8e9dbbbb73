"""The model panel at the top of the left column: pick and load a target/draft pair, with progress, and measure its
figures again. A failed load leaves the previous pair in place. The figures are measured beside serving: the pair
line says "measuring" until they are in, and a timer redraws it until then (and only until then)."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from app import toast
from app.context import AppContext
from app.settings import model_choices
from app.tabs.engine_queue import ENGINE, UNTRACKED
from app.baseline import speed_record
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
    poll: gr.Timer  # redraws the pair line while its figures are measured; inactive once they are in


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
                           "up to k 16, and a llama.cpp target runs with an f16 KV cache on repacked or stored weights, "
                           "whichever is timed faster here (identical up to ties, measured on the pair line)", elem_id="verify-mode")
    status = gr.HTML(elem_id="pair-status")
    poll = gr.Timer(POLL_S, active=bool(pair and pair.measuring))
    return PairPanel(target=target_box, target_precision=target_prec, draft=draft_box, draft_precision=draft_prec,
                     load=load, remeasure=remeasure, verify=verify, status=status, poll=poll)


POLL_S = 2.0  # how often the pair line is redrawn while the pair's figures are measured


def pair_status_html(pair: PairInfo | None, note: str = "") -> str:
    """The pair line: the models, the runner, the target-only speed measured with the pair's figures (its
    ``target_speed``, the one source), what is being measured or how it was, and the identity and verify notes."""
    baseline = None if pair is None else speed_record(pair)
    if pair is None:
        body = "No pair loaded yet."
    else:
        body = (f'<b>target</b> {esc(pair.target)} <span class="prec">{esc(pair.target_precision)}</span>'
                f' · <b>draft</b> {esc(pair.draft)} <span class="prec">{esc(pair.draft_precision)}</span>'
                f' · {esc(pair.device)}' + (f' · {esc(pair.runner)}' if pair.runner else ""))
        if baseline:
            body += (f' · target-only {baseline["decode_tokens_per_s"]:.1f} tok/s decoding, '
                     f'{baseline["tokens_per_s"]:.1f} end to end')
        if pair.measuring:
            body += ' · <span class="measuring">measuring</span>'
        elif pair.checks_note:
            flagged = "flagged" if pair.checks_flagged else "measured"
            body += f'<div class="checks-note {flagged}">{esc(pair.checks_note)}</div>' 
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
            pair = ctx.engine.load_pair((target or "").strip(), (draft or "").strip(),
                                        _precision(target_precision), _precision(draft_precision))
        except (EngineError, OSError) as err:  # a bad name or pair, a failed download, a full disk: the old pair stays
            message = error_message(err)
            toast.warn(f"Could not load the pair: {message}")
            kept = ctx.pair()
            return {panel.status: pair_status_html(kept, "The previous pair is still loaded." if kept else ""),
                    error_box: error_html(f"Could not load the pair: {message}")}
        toast.info("Pair loaded." + (" Its figures are measured while the app is idle." if
                                     pair and pair.measuring else ""))
        return {**redraw(pair), error_box: error_html(None)}

    def remeasure():
        if ctx.pair() is None:
            return {error_box: error_html("load a pair first")}
        return redraw(ctx.engine.remeasure())

    def redraw(pair: PairInfo | None):
        """The pair line, the empty panel and the verify choice as ``pair``'s figures now stand (one read of the
        pair); the timer runs while they are measured."""
        return {**shown(pair), stats: render_stats(None, None, ctx.speed(pair))}

    def poll():
        """What the timer redraws: the pair line and the verify choice (the stats panel may hold an answer's)."""
        return shown(ctx.pair())

    def shown(pair: PairInfo | None):
        return {panel.status: pair_status_html(pair), panel.verify: (pair.verify_mode or None) if pair else None,
                panel.poll: gr.Timer(active=bool(pair and pair.measuring))}

    def verify(mode: str | None):
        loaded = ctx.pair()
        if loaded is None or not mode:
            return {error_box: error_html("load a pair first" if loaded is None else None)}
        try:
            info = ctx.engine.set_verify_mode(mode)
        except EngineError as err:  # a pair with no choice, or an unknown mode: the pair stays as it was
            toast.warn(error_message(err))
            return {error_box: error_html(error_message(err)), panel.status: pair_status_html(ctx.pair())}
        return {**shown(info), error_box: error_html(None)}  # a switch of runner is measured: the line polls

    return dict(load=load, remeasure=remeasure, verify=verify, poll=poll)


def wire(ctx: AppContext, panel: PairPanel, error_box, stats) -> None:
    h = make_pair_handlers(ctx, panel, error_box, stats)
    inputs = [panel.target, panel.target_precision, panel.draft, panel.draft_precision]
    outputs = [panel.status, error_box, stats, panel.verify, panel.poll]
    panel.load.click(h["load"], inputs, outputs, api_name="load_pair", **ENGINE)
    panel.remeasure.click(h["remeasure"], None, outputs, api_name="measure_baseline", **ENGINE)
    # not on the engine queue: a redraw reads the pair, and must not wait behind an answer
    panel.poll.tick(h["poll"], None, [panel.status, panel.verify, panel.poll], api_visibility="private",
                    **UNTRACKED)
    panel.verify.input(h["verify"], [panel.verify], [panel.status, error_box, panel.verify, panel.poll],
                       api_name="set_verify_mode", **ENGINE)
