"""The Gradio app: layout from the ``create_*`` functions, then the event wiring. No models load here."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from app.api.gradio_chat import make_chat_api
from app.tabs.cache import cache_view, create_cache_tab, make_cache_handlers
from app.tabs.chat import make_handlers
from app.components import (create_cache_controls, create_chat_panel, create_decoding_panel, create_model_panel,
                            create_stats_panel, settings_fields)
from app.context import AppContext
from app.examples import example_inputs, example_labels
from app.views.markdown import pygments_css
from app.tabs.pair import make_pair_handlers, pair_status_html
from app.tabs.experiments import FORM, create_experiments_tab, make_experiment_handlers
from app.tabs.race import create_race_tab, make_race_handlers
from app.views.stats import render_stats

ASSETS = Path(__file__).resolve().parent.parent / "assets"
ENGINE = dict(concurrency_id="engine", concurrency_limit=1)  # one generation or load at a time; others queue
HEADER = ('<div class="app-header"><h1>SpecLens</h1><p>Speculative decoding, made visible: a small draft '
          "model guesses the next tokens, the target checks them all in one forward pass.</p></div>")


def build_demo(ctx: AppContext) -> gr.Blocks:
    with gr.Blocks(title="SpecLens — speculative decoding", analytics_enabled=False) as demo:
        gr.HTML(HEADER)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=350, elem_id="controls"):
                elems = create_model_panel(ctx.pair())
                elems.update(create_decoding_panel())
                elems.update(create_cache_controls(ctx.engine.cache_info()))
            with gr.Column(scale=4):
                with gr.Tabs():
                    with gr.Tab("Chat", id="chat-tab"):
                        with gr.Row(equal_height=False):
                            with gr.Column(scale=3, min_width=420):
                                elems.update(create_chat_panel(example_inputs(), example_labels()))
                            with gr.Column(scale=2, min_width=340):
                                elems.update(create_stats_panel(render_stats(None, None, ctx.baseline())))
                    with gr.Tab("Race", id="race-tab"):
                        elems.update(create_race_tab())
                    with gr.Tab("Cache", id="cache-tab") as cache_tab:
                        elems.update(create_cache_tab())
                    with gr.Tab("Experiments", id="experiments-tab"):
                        elems.update(create_experiments_tab(ctx.pair()))
        wire_chat(ctx, elems)
        wire_race(ctx, elems)
        wire_ghosts(elems)
        wire_cache(ctx, elems, cache_tab)
        wire_pair(ctx, elems)
        wire_experiments(ctx, elems)
        gr.api(make_chat_api(ctx), api_name="chat", **ENGINE)
        demo.load(lambda: (pair_status_html(ctx.pair(), ctx.baseline()), render_stats(None, None, ctx.baseline())),
                  None, [elems["pair_status"], elems["stats"]], api_visibility="private")
    return demo


def wire_chat(ctx: AppContext, e: dict) -> None:
    h = make_handlers(ctx, e)
    inputs = {*settings_fields(e).values(), e["msg"], e["history"], e["shown"]}
    outputs = [e[n] for n in ("chatbot", "shown", "history", "trace", "stats", "accept_plot", "speed_plot", "msg",
                              "error_box")]
    send = gr.on([e["msg"].submit, e["send"].click], h["send"], inputs, outputs, api_name="send",
                 show_progress_on=[e["chatbot"]], **ENGINE)
    regen = e["regen"].click(h["regenerate"], inputs, outputs, api_name="regenerate",
                             show_progress_on=[e["chatbot"]], **ENGINE)
    e["stop"].click(h["stop"], None, [e["error_box"]], queue=False, api_visibility="private")
    e["clear"].click(h["clear"], None, [e[n] for n in ("chatbot", "shown", "history", "trace", "error_box", "stats",
                                                        "accept_plot", "speed_plot", "trace_file")],
                     cancels=[send, regen], queue=False, api_name="clear")
    e["export"].click(h["export"], [e["trace"]], [e["trace_file"]], api_name="export_trace")
    for event in (send, regen):
        event.then(lambda: cache_view(ctx.engine), None, [e["cache_summary"], e["cache_table"], e["cache_pick"]],
                   api_visibility="private", show_progress="hidden")


def view_classes(base: list[str], show_rejected: bool, answer_view: str) -> list[str]:
    return base + ([] if show_rejected else ["hide-rejected"]) + (["view-tokens"] if answer_view == "tokens" else [])


def wire_ghosts(e: dict) -> None:
    """The "show rejected draft tokens" and "answer view" switches: CSS classes on the answer views, so they
    apply to old answers too."""
    base = {"chatbot": [], "race_target": ["race-answer"], "race_spec": ["race-answer"]}
    views = [e[name] for name in base]

    def toggle(show: bool, answer_view: str):
        return [gr.update(elem_classes=view_classes(classes, show, answer_view)) for classes in base.values()]

    for switch in (e["show_rejected"], e["answer_view"]):
        switch.change(toggle, [e["show_rejected"], e["answer_view"]], views, queue=False, api_visibility="private")


def wire_race(ctx: AppContext, e: dict) -> None:
    h = make_race_handlers(ctx, e)
    inputs = {*settings_fields(e).values(), e["race_prompt"]}
    outputs = [e[n] for n in ("race_summary", "race_target", "race_spec", "error_box")]
    outputs += [e[n] for n in ("race_prove", "race_proof", "race_trace")]
    race = gr.on([e["race_prompt"].submit, e["race_run"].click], h["race"], inputs, outputs, api_name="race",
                 **ENGINE)
    e["race_stop"].click(h["race_stop"], None, None, cancels=[race], queue=False, api_visibility="private")
    e["race_prove"].click(h["race_prove"], [e["race_trace"]], [e["race_proof"], e["race_trace"]],
                          api_name="race_prove_fp32", show_progress_on=[e["race_proof"]], **ENGINE)
    e["race_export"].click(h["race_export"], [e["race_trace"]], [e["race_trace_file"]], api_visibility="private")


def wire_cache(ctx: AppContext, e: dict, tab) -> None:
    h = make_cache_handlers(ctx.engine)
    outputs = [e["cache_summary"], e["cache_table"], e["cache_pick"]]
    tab.select(h["refresh"], None, outputs, api_visibility="private")
    e["cache_refresh"].click(h["refresh"], None, outputs, api_name="cache_entries")
    e["cache_delete"].click(h["delete"], [e["cache_pick"]], outputs, api_name="cache_delete")
    e["cache_clear"].click(h["clear"], None, outputs, api_name="cache_clear")


def wire_pair(ctx: AppContext, e: dict) -> None:
    h = make_pair_handlers(ctx, e)
    inputs = [e["target"], e["target_precision"], e["draft"], e["draft_precision"]]
    outputs = [e["pair_status"], e["error_box"], e["stats"]]
    e["load_btn"].click(h["load"], inputs, outputs, api_name="load_pair", **ENGINE)
    e["remeasure"].click(h["remeasure"], None, outputs, api_name="measure_baseline", **ENGINE)


def wire_experiments(ctx: AppContext, e: dict) -> None:
    h = make_experiment_handlers(ctx, e)
    form = {e[n] for n in FORM}
    views = [e[n] for n in ("exp_progress", "exp_table", "exp_speedup", "exp_accept", "exp_doctor_out", "exp_csv",
                            "exp_json", "exp_html", "exp_result")]
    e["exp_run"].click(h["run"], {*form, e["exp_doctor_state"]}, views, api_name="run_experiment",
                       show_progress="hidden", **ENGINE)
    e["exp_doctor"].click(h["doctor"], {e["exp_sets"], e["exp_result"]}, [e["exp_doctor_out"], e["exp_doctor_state"]],
                          api_name="pair_doctor", show_progress="hidden", **ENGINE)
    e["exp_stop"].click(h["stop"], None, None, queue=False, api_visibility="private")
    e["exp_load"].upload(h["load"], [e["exp_load"]], [*views, *(e[n] for n in FORM)], api_visibility="private")


def launch_kwargs() -> dict:
    """What ``demo.launch`` needs for the look (Gradio 6 takes theme and CSS at launch)."""
    return dict(css_paths=[ASSETS / "style.css"], css=pygments_css(),
                theme=gr.themes.Soft(primary_hue="indigo", neutral_hue="slate"))
