"""The decoding and cache controls in the left column: every tab that decodes (chat, race) reads them.

Their components are named as the ``UISettings`` fields they hold, so ``Controls.read`` turns a handler's
input dict into one ``UISettings`` without a second list of names. The "show rejected" and "answer view"
switches only change CSS classes on the answer views (``wire_answer_views``), so they apply to old answers too.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import gradio as gr

from app.settings import UISettings
from app.tabs.engine_queue import UNTRACKED
from engine.config import CACHE_MODES, MAX_K, MAX_NEW_TOKENS, PROPOSER_NAMES
from engine.surface import CacheInfo

ANSWER_VIEWS = ("rendered", "tokens")


@dataclass(frozen=True)
class DecodingControls:
    proposer: gr.Dropdown
    k: gr.Number
    adaptive: gr.Checkbox
    temperature: gr.Slider
    top_p: gr.Slider
    max_new_tokens: gr.Number
    seed: gr.Textbox
    show_rejected: gr.Checkbox
    answer_view: gr.Radio


@dataclass(frozen=True)
class CacheControls:
    note: gr.Markdown
    cache_enabled: gr.Checkbox
    cache_mode: gr.Radio
    cache_threshold: gr.Slider


@dataclass(frozen=True)
class Controls:
    decoding: DecodingControls
    cache: CacheControls

    def settings_fields(self) -> dict:
        """UISettings field name -> the component that holds it."""
        named = {**components(self.decoding), **components(self.cache)}
        return {name: named[name] for name in UISettings.__dataclass_fields__}

    def read(self, data: dict) -> UISettings:
        """The settings as the user left them, from a handler's input dict (component -> value)."""
        return UISettings(**{name: data[comp] for name, comp in self.settings_fields().items()})


def components(record) -> dict:
    """A record's field name -> component (``dataclasses.asdict`` would deep-copy the components)."""
    return {f.name: getattr(record, f.name) for f in fields(record)}


def create(cache: CacheInfo) -> Controls:
    return Controls(create_decoding_panel(), create_cache_controls(cache))


def create_decoding_panel() -> DecodingControls:
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
    return DecodingControls(proposer=proposer, k=k, adaptive=adaptive, temperature=temperature, top_p=top_p,
                            max_new_tokens=max_new, seed=seed, show_rejected=show_rejected, answer_view=answer_view)


def create_cache_controls(cache: CacheInfo) -> CacheControls:
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
    return CacheControls(note=note, cache_enabled=enabled, cache_mode=mode, cache_threshold=threshold)


def view_classes(base: list[str], show_rejected: bool, answer_view: str) -> list[str]:
    return base + ([] if show_rejected else ["hide-rejected"]) + (["view-tokens"] if answer_view == "tokens" else [])


def wire_answer_views(controls: Controls, views: list[tuple[gr.components.Component, list[str]]]) -> None:
    """The two switches set CSS classes on each answer view (``views``: the component and its own classes)."""
    d = controls.decoding

    def toggle(show: bool, answer_view: str):
        return [gr.update(elem_classes=view_classes(classes, show, answer_view)) for _, classes in views]

    for switch in (d.show_rejected, d.answer_view):
        switch.change(toggle, [d.show_rejected, d.answer_view], [view for view, _ in views], queue=False,
                      api_visibility="private", **UNTRACKED)
