"""The semantic-cache tab: entry count, hit rates, recent entries, delete one, clear all.

Everything comes through the engine's cache methods (engine.surface.EngineSurface): ``cache_info()`` says
whether there is a cache and where its entries live (password masked), ``cache_stats()`` counts, and its
``warning`` says why the cache is not working right now (e.g. Redis unreachable).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr
import pandas as pd

from app import toast
from app.context import AppContext
from app.tabs.engine_queue import UNTRACKED
from app.views.render import esc
from engine.surface import CacheEntry, CacheInfo, CacheStats, EngineSurface, StoreUnavailable

RECENT = 50
COLUMNS = ["created", "prompt", "answer", "key"]


@dataclass(frozen=True)
class CacheTab:
    tab: gr.Tab  # selecting it refreshes the view
    summary: gr.HTML
    table: gr.Dataframe
    pick: gr.Dropdown
    delete: gr.Button
    clear: gr.Button
    refresh: gr.Button

    def views(self) -> list:
        """What ``cache_view`` fills, in its order."""
        return [self.summary, self.table, self.pick]


def create() -> CacheTab:
    with gr.Tab("Cache", id="cache-tab") as tab:
        summary = gr.HTML(elem_id="cache-summary")
        table = gr.Dataframe(headers=COLUMNS, interactive=False, wrap=True, elem_id="cache-entries",
                             label=f"Most recent entries (up to {RECENT})")
        with gr.Row(equal_height=True):
            pick = gr.Dropdown([], label="Entry", scale=4, elem_id="cache-pick")
            delete = gr.Button("Delete entry", scale=1, elem_id="cache-delete")
            clear = gr.Button("Clear all", variant="stop", scale=1, elem_id="cache-clear")
            refresh = gr.Button("Refresh", scale=1, elem_id="cache-refresh")
    return CacheTab(tab=tab, summary=summary, table=table, pick=pick, delete=delete, clear=clear, refresh=refresh)


def _hits(hits) -> str:
    return " · ".join(f"{outcome} {n}" for outcome, n in hits.items()) or "–"


def _cards(stats: CacheStats) -> list[tuple[str, str]]:
    return [("entries", str(stats.entries)), ("lookups", str(stats.lookups)), ("hits", _hits(stats.hits)),
            ("misses", str(stats.misses)), ("hit rate", f"{stats.hit_rate:.1%}"),
            ("time saved", f"{stats.time_saved_s:.1f} s")]


def cache_summary_html(info: CacheInfo, stats: CacheStats | None) -> str:
    if not info.available or stats is None:
        return '<div class="cache-summary">The semantic cache is not available in this engine build.</div>'
    cells = "".join(f'<div class="stat-card"><div class="stat-value">{esc(v)}</div>'
                    f'<div class="stat-label">{esc(k)}</div></div>' for k, v in _cards(stats))
    where = f'<div class="cache-backend">stored in {esc(info.backend)}</div>' if info.backend else ""
    if info.judge:
        where += f'<div class="cache-judge">{esc(info.judge)}</div>'

    alert = f'<div class="cache-warning" role="alert">\u26a0 {esc(stats.warning)}</div>' if stats.warning else ""
    return f'{alert}<div class="cache-summary stat-grid">{cells}</div>{where}'


def _unavailable_html(err: StoreUnavailable) -> str:
    return f'<div class="cache-warning" role="alert">\u26a0 cache statistics unavailable: {esc(err)}</div>'


def _created(value: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value))


def entries_frame(entries: list[CacheEntry]) -> pd.DataFrame:
    """Entries as plain text (the Dataframe shows text, not HTML)."""
    return pd.DataFrame([{"created": _created(e.created), "prompt": e.prompt, "answer": e.answer, "key": e.key}
                         for e in entries], columns=COLUMNS)


def cache_view(engine: EngineSurface) -> tuple:
    try:
        summary, entries = cache_summary_html(engine.cache_info(), engine.cache_stats()), engine.cache_entries(RECENT)
    except StoreUnavailable as err:  # a store that cannot be reached must not break the tab
        summary, entries = _unavailable_html(err), []
    frame = entries_frame(entries)
    choices = [(f"{e.prompt[:60]} [{e.key[:8]}]", e.key) for e in entries]
    return summary, frame, gr.update(choices=choices, value=None)


def make_cache_handlers(engine: EngineSurface) -> dict:
    def refresh():
        return cache_view(engine)

    def delete(key: str | None):
        if not key:
            toast.warn("pick an entry to delete")
        elif engine.cache_delete(key):
            toast.info("entry deleted")
        else:
            toast.warn("no such entry: deleted already, or the cache is unreachable")
        return cache_view(engine)

    def clear():
        if engine.cache_info().available:
            engine.cache_clear()
            toast.info("cache cleared")
        return cache_view(engine)

    return dict(refresh=refresh, delete=delete, clear=clear)


def wire(ctx: AppContext, tab: CacheTab) -> None:
    h = make_cache_handlers(ctx.engine)
    # progress on the summary alone: a table that was a progress target is read again at every frame of every answer
    # (app/tabs/engine_queue.py)
    progress = dict(show_progress_on=[tab.summary])
    tab.tab.select(h["refresh"], None, tab.views(), queue=False, api_visibility="private", **UNTRACKED)  # docs/app.md
    tab.refresh.click(h["refresh"], None, tab.views(), api_name="cache_entries", **progress)
    tab.delete.click(h["delete"], [tab.pick], tab.views(), api_name="cache_delete", **progress)
    tab.clear.click(h["clear"], None, tab.views(), api_name="cache_clear", **progress)


def refresh_after(ctx: AppContext, tab: CacheTab, events: list) -> None:
    """After each of ``events`` (an answer that may have stored a new entry), the view shows the cache again."""
    for event in events:
        event.then(lambda: cache_view(ctx.engine), None, tab.views(), queue=False, api_visibility="private",
                   **UNTRACKED)  # not queued, as the join it follows (app/tabs/chat.py)
