"""The semantic-cache tab: entry count, hit rates, recent entries, delete one, clear all.

Reads ``engine.cache`` (None, or an object with ``stats() -> dict``, ``entries(limit) -> list[dict]`` with keys
key/prompt/answer/created, ``delete(key)``, ``clear()`` and ``len()``).
"""
from __future__ import annotations

import time

import gradio as gr
import pandas as pd

from app import toast
from app.render import esc

RECENT = 50
COLUMNS = ["created", "prompt", "answer", "key"]


def create_cache_tab() -> dict:
    summary = gr.HTML(elem_id="cache-summary")
    table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, elem_id="cache-entries",
                         label=f"Most recent entries (up to {RECENT})")
    with gr.Row(equal_height=True):
        pick = gr.Dropdown([], label="Entry", scale=4, elem_id="cache-pick")
        delete = gr.Button("Delete entry", scale=1, elem_id="cache-delete")
        clear = gr.Button("Clear all", variant="stop", scale=1, elem_id="cache-clear")
        refresh = gr.Button("Refresh", scale=1, elem_id="cache-refresh")
    return dict(cache_summary=summary, cache_table=table, cache_pick=pick, cache_delete=delete,
                cache_clear=clear, cache_refresh=refresh)


def _fmt(name: str, value) -> str:
    if isinstance(value, dict):
        return " · ".join(f"{k} {_fmt(k, v)}" for k, v in value.items()) or "–"
    if isinstance(value, float):
        if name.endswith("_s"):
            return f"{value:.1f} s"
        return f"{value:.1%}" if "rate" in name else f"{value:.3g}"
    return str(value)


def _label(name: str) -> str:
    return (name[:-2] if name.endswith("_s") else name).replace("_", " ")


def cache_summary_html(cache) -> str:
    if cache is None:
        return '<div class="cache-summary">The semantic cache is not available in this engine build.</div>'
    try:
        stats = dict(cache.stats())
    except Exception as err:  # a broken cache must not break the tab
        return f'<div class="cache-summary">cache statistics unavailable: {esc(err)}</div>'
    items = [("entries", str(len(cache)))] + [(_label(str(k)), _fmt(str(k), v))
                                              for k, v in stats.items() if k != "entries"]
    cells = "".join(f'<div class="stat-card"><div class="stat-value">{esc(v)}</div>'
                    f'<div class="stat-label">{esc(k)}</div></div>' for k, v in items)
    return f'<div class="cache-summary stat-grid">{cells}</div>'


def _created(value) -> str:
    if isinstance(value, (int, float)):
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))
    return "" if value is None else str(value)


def entries_frame(cache) -> pd.DataFrame:
    """Entries as plain text (the Dataframe shows text, not HTML)."""
    rows = [] if cache is None else cache.entries(RECENT)
    return pd.DataFrame([{"created": _created(e.get("created")), "prompt": str(e.get("prompt", "")),
                          "answer": str(e.get("answer", "")), "key": str(e.get("key", ""))} for e in rows],
                        columns=COLUMNS)


def cache_view(engine) -> tuple:
    cache = getattr(engine, "cache", None)
    frame = entries_frame(cache)
    choices = [(f"{p[:60]} [{k[:8]}]", k) for p, k in zip(frame["prompt"], frame["key"])]
    return cache_summary_html(cache), frame, gr.update(choices=choices, value=None)


def make_cache_handlers(engine) -> dict:
    def refresh():
        return cache_view(engine)

    def delete(key: str | None):
        cache = getattr(engine, "cache", None)
        if cache is None or not key:
            toast.warn("pick an entry to delete")
        else:
            cache.delete(key)
            toast.info("entry deleted")
        return cache_view(engine)

    def clear():
        cache = getattr(engine, "cache", None)
        if cache is not None:
            cache.clear()
            toast.info("cache cleared")
        return cache_view(engine)

    return dict(refresh=refresh, delete=delete, clear=clear)
