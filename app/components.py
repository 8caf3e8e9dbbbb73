"""The controls, built from small ``create_*`` functions that each return a dict of named components."""
from __future__ import annotations

import gradio as gr

from app.views.render import legend_html
from app.views.stats import SERIES_COLORS
from app.settings import UISettings, model_choices
from engine.config import AUTO, CACHE_MODES, MAX_K, MAX_NEW_TOKENS, PRECISIONS, PROPOSER_NAMES
from engine.surface import CacheInfo

ANSWER_VIEWS = ("rendered", "tokens")
PRECISION_CHOICES = list(PRECISIONS)  # "auto" first: the measured fastest for this machine


def create_model_panel(pair: dict | None) -> dict:
    choices = model_choices()
    target = (pair or {}).get("target") or (choices[0] if choices else "")
    draft = (pair or {}).get("draft") or (choices[-1] if choices else "")
    target_box = gr.Dropdown(choices, value=target, label="Target model", allow_custom_value=True,
                             info="built-in name, HF id, local path or .gguf", elem_id="target")
    target_prec = gr.Radio(PRECISION_CHOICES, value=(pair or {}).get("target_precision", AUTO),
                           show_label=False, elem_id="target-precision", elem_classes=["precision"])
    draft_box = gr.Dropdown(choices, value=draft, label="Draft model", allow_custom_value=True, elem_id="draft")
    draft_prec = gr.Radio(PRECISION_CHOICES, value=(pair or {}).get("draft_precision", AUTO),
                          show_label=False, elem_id="draft-precision", elem_classes=["precision"])
    with gr.Row():
        load_btn = gr.Button("Load pair", variant="primary", elem_id="load-pair", scale=1, min_width=90)
        remeasure = gr.Button("Re-measure", elem_id="remeasure", scale=1, min_width=90)
    pair_status = gr.HTML(elem_id="pair-status")
    return dict(target=target_box, target_precision=target_prec, draft=draft_box, draft_precision=draft_prec,
                load_btn=load_btn, remeasure=remeasure, pair_status=pair_status)


def create_decoding_panel() -> dict:
    d = UISettings()
    with gr.Accordion("Decoding", open=True):
        proposer = gr.Dropdown(list(PROPOSER_NAMES), value=d.proposer, label="Proposer", elem_id="proposer")
        with gr.Row():
            # precision=None: Gradio passes the number as typed (precision=0 would round 2.5 to 2 silently);
            # app.settings hands it to the engine's config, which refuses what is not a whole number
            k = gr.Number(d.k, precision=None, label=f"k (draft length, 1–{MAX_K})", elem_id="k", min_width=80)
            adaptive = gr.Checkbox(d.adaptive, label="adaptive k", elem_id="adaptive")
        with gr.Row():
            temperature = gr.Slider(0.0, 2.0, d.temperature, step=0.05, label="temperature (0 = greedy)")
            top_p = gr.Slider(0.05, 1.0, d.top_p, step=0.05, label="top-p")
        with gr.Row():
            max_new = gr.Number(d.max_new_tokens, precision=None, label=f"max new tokens (≤ {MAX_NEW_TOKENS})",
                                elem_id="max-new-tokens", min_width=80)
            # a text box: a seed above 2**53 would not survive a float (and a JavaScript number)
            seed = gr.Textbox("", label="seed (blank = random)", elem_id="seed", min_width=80, max_lines=1)
        show_rejected = gr.Checkbox(d.show_rejected, label="show rejected draft tokens (struck through)",
                                    elem_id="show-rejected")
        answer_view = gr.Radio(list(ANSWER_VIEWS), value=ANSWER_VIEWS[0], label="answer view",
                               elem_id="answer-view", info="rendered: Markdown with the colours; tokens: raw text")
    return dict(proposer=proposer, k=k, adaptive=adaptive, temperature=temperature, top_p=top_p,
                max_new_tokens=max_new, seed=seed, show_rejected=show_rejected, answer_view=answer_view)


def create_cache_controls(cache: CacheInfo) -> dict:
    """The cache switch, mode and threshold, starting from the engine's cache settings."""
    d, available = UISettings(), cache.available
    with gr.Accordion("Semantic cache", open=True):
        note = gr.Markdown("" if available else "*The semantic cache is not available (see the launch log).*")
        enabled = gr.Checkbox(d.cache_enabled and available, label="use the cache", interactive=available,
                              elem_id="cache-enabled")
        mode = gr.Radio([m for m in CACHE_MODES if m != "off"], value=d.cache_mode, label="mode",
                        interactive=available, elem_id="cache-mode",  # "off" is the checkbox above
                        info="verify: the target checks a cached answer as a draft; direct: serve it as is")
        threshold = gr.Slider(0.5, 1.0, cache.threshold, step=0.01, label="similarity threshold",
                              interactive=available, elem_id="cache-threshold")
    return dict(cache_note=note, cache_enabled=enabled, cache_mode=mode, cache_threshold=threshold)


def create_chat_panel(examples: list[list[str]], example_labels: list[str]) -> dict:
    legend = gr.HTML(legend_html(), elem_id="legend")
    chatbot = gr.Chatbot(elem_id="chat", height=470, render_markdown=False, sanitize_html=True,
                         latex_delimiters=[], allow_tags=False, feedback_options=None, buttons=["copy"],
                         group_consecutive_messages=False, label="Chat", show_label=False,
                         placeholder="Ask something. Each answer token is coloured by how it was produced.")
    error_box = gr.HTML(elem_id="error-box")
    with gr.Row(equal_height=True):
        # Gradio submits on Enter only when lines == 1 (with more lines it submits on Shift+Enter); max_lines > 1
        # lets Shift+Enter add lines and the box grow up to that many
        msg = gr.Textbox(placeholder="Message (Enter to send, Shift+Enter for a new line)", show_label=False,
                         lines=1, max_lines=8, scale=6, elem_id="msg", autofocus=True)
        send = gr.Button("Send", variant="primary", scale=1, elem_id="send", min_width=80)
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop", min_width=80)
    with gr.Row():
        regen = gr.Button("↻ Regenerate", size="sm", elem_id="regenerate")
        clear = gr.Button("Clear chat", size="sm", elem_id="clear")
        export = gr.Button("Export trace (JSON)", size="sm", elem_id="export")
    trace_file = gr.File(label="Speculation trace of the last answer", visible=False, elem_id="trace-file")
    gr.Examples(examples, inputs=[msg], label="Examples (code and edits accept many draft tokens; poems and "
                                             "random lists accept few)", example_labels=example_labels,
                examples_per_page=8)
    history = gr.State([])  # raw messages for the engine: [{"role", "content"}], no HTML
    shown = gr.State([])  # the same messages as displayed: escaped HTML
    trace = gr.State({})  # the last answer's trace document
    return dict(legend=legend, chatbot=chatbot, error_box=error_box, msg=msg, send=send, stop=stop, regen=regen,
                clear=clear, export=export, trace_file=trace_file, history=history, shown=shown, trace=trace)


def create_stats_panel(stats_html: str) -> dict:
    stats = gr.HTML(stats_html, elem_id="stats")
    accept_plot = gr.BarPlot(x="position", y="acceptance", title="Acceptance by draft position",
                             y_lim=[0, 1], height=220, elem_id="accept-plot", x_title="draft position",
                             y_title="accepted / proposed")
    speed_plot = gr.LinePlot(x="k", y="speedup", color="series", color_map=SERIES_COLORS, height=250,
                             title="Speedup vs draft length k",
                             caption="theory: (1-α^(k+1)) / ((1-α)(k·c+1)) with the measured α and c",
                             elem_id="speed-plot", x_title="draft length k", y_title="speedup ×")
    return dict(stats=stats, accept_plot=accept_plot, speed_plot=speed_plot)


def settings_fields(elems: dict) -> dict:
    """UISettings field name -> component."""
    return {name: elems[name] for name in UISettings.__dataclass_fields__}


def read_settings(elems: dict, data: dict) -> UISettings:
    return UISettings(**{name: data[comp] for name, comp in settings_fields(elems).items()})
