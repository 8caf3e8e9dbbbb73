"""app/tabs/cache.py: the cache tab's summary (escaped), its entries as text, delete and clear."""
import pytest

from app.tabs.cache import cache_summary_html, cache_view, entries_frame, make_cache_handlers
from engine.surface import CacheEntry, CacheStats
from tests.helpers.fakes import SCRIPT, FakeEngine, assert_inert


def test_cache_panel_escapes_and_counts():
    engine = FakeEngine([])
    html = cache_summary_html(engine.cache_info(), engine.cache_stats())
    assert_inert(html)
    assert "<b>" not in html
    assert "50.0%" in html and ">1<" in html and "exact 1 · verified 1" in html and "2.5 s" in html
    assert "time saved" in html and "stored in redis://:***@&lt;b&gt;host" in html
    assert entries_frame(engine.cache_entries())["prompt"][0] == SCRIPT  # a Dataframe shows text, never HTML
    no_cache = FakeEngine([], cache=False)
    assert "not available" in cache_summary_html(no_cache.cache_info(), no_cache.cache_stats())
    warned = cache_summary_html(engine.cache_info(), CacheStats(entries=0, warning="Redis <i>unreachable</i>"))
    assert "cache-warning" in warned and "&lt;i&gt;unreachable" in warned


def test_cache_tab_deletes_and_clears_through_the_engine_methods():
    engine = FakeEngine([])
    handlers = make_cache_handlers(engine)
    summary, frame, pick = handlers["refresh"]()
    assert list(frame["key"]) == ["k1"] and pick["choices"] == [(f"{SCRIPT[:60]} [k1]", "k1")]
    _, frame, _ = handlers["delete"]("k1")
    assert frame.empty and engine.entries == []
    with pytest.warns(UserWarning, match="no such entry"):  # a warning toast, outside a Gradio request
        handlers["delete"]("k1")
    engine.entries = [CacheEntry("k2", "q", "a", 0.0)]
    _, frame, _ = handlers["clear"]()
    assert frame.empty and engine.entries == []
    assert "not available" in cache_view(FakeEngine([], cache=False))[0]
