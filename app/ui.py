"""The Gradio app, assembled from its tabs: each tab (app/tabs/) builds its components into its own record and
wires its own events; this module lays them out and connects the few things that cross tabs. No models load here."""
from __future__ import annotations

from pathlib import Path

import gradio as gr

from app.api.gradio_chat import make_chat_api
from app.context import AppContext
from app.tabs import cache, chat, controls, experiments, pair, race
from app.tabs.engine_queue import ENGINE, UNTRACKED
from app.views.markdown import pygments_css
from app.views.stats import render_stats

ASSETS = Path(__file__).resolve().parent.parent / "assets"
HEADER = ('<div class="app-header"><h1>SpecLens</h1><p>Speculative decoding, made visible: a small draft '
          "model guesses the next tokens, the target checks them all in one forward pass.</p></div>")


def build_demo(ctx: AppContext) -> gr.Blocks:
    loaded = ctx.pair()  # read once: every tab is built for the same pair
    with gr.Blocks(title="SpecLens — speculative decoding", analytics_enabled=False) as demo:
        gr.HTML(HEADER)
        with gr.Row(equal_height=False):
            with gr.Column(scale=1, min_width=350, elem_id="controls"):
                pair_panel = pair.create(loaded)
                settings = controls.create(ctx.engine.cache_info())
            with gr.Column(scale=4):
                with gr.Tabs():
                    chat_tab = chat.create(ctx.speed(loaded))
                    race_tab = race.create(chat_tab.error_box)
                    cache_tab = cache.create()
                    experiments_tab = experiments.create(loaded)
        answers = chat.wire(ctx, chat_tab, settings)
        cache.refresh_after(ctx, cache_tab, answers)  # an answer may have stored a new entry
        race.wire(ctx, race_tab, settings)
        controls.wire_answer_views(settings, chat.answer_views(chat_tab) + race.answer_views(race_tab))
        cache.wire(ctx, cache_tab)
        pair.wire(ctx, pair_panel, chat_tab.error_box, chat_tab.stats)
        experiments.wire(ctx, experiments_tab)
        gr.api(make_chat_api(ctx), api_name="chat", **ENGINE)
        demo.load(lambda: _opened(ctx), None, [pair_panel.status, chat_tab.stats], api_visibility="private",
                  **UNTRACKED)
    return demo


def _opened(ctx: AppContext) -> tuple[str, str]:
    """What a page shows when it opens: the pair line and the empty panel, of one read of the pair."""
    loaded = ctx.pair()
    return pair.pair_status_html(loaded), render_stats(None, None, ctx.speed(loaded))


def launch_kwargs() -> dict:
    """What ``demo.launch`` needs for the look (Gradio 6 takes theme and CSS at launch), and no run history: Gradio
    6.31's page would keep every run's inputs and outputs (prompts and answers included) in the browser's
    localStorage, reading and writing the whole list again at each streamed frame, twice a second, on the cores the
    model decodes on (docs/bench.md, the page's profile)."""
    return dict(css_paths=[ASSETS / "style.css"], css=pygments_css(), run_history=False,
                theme=gr.themes.Soft(primary_hue="indigo", neutral_hue="slate"))
