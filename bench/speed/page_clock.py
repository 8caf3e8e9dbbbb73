"""A Chromium page's own clocks and its JavaScript CPU profile (Chrome DevTools Protocol), for the serving bench's
pages: the app's chat (bench/speed/serving_paths.py) and the floor (bench/speed/serving_floor.py)."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

# Chromium's own clocks for a page (CDP Performance.getMetrics, seconds of the renderer's main thread): what an answer
# cost the page, by kind; "task" is all of it (script, style, layout and the rest: paint, parsing, GC outside scripts)
PAGE_METRICS = {"task": "TaskDuration", "script": "ScriptDuration", "style": "RecalcStyleDuration",
                "layout": "LayoutDuration"}


class PageClock:
    """A page's main-thread seconds by kind (``PAGE_METRICS``), and its JavaScript CPU profile on demand (CDP)."""

    def __init__(self, page):
        self.cdp = page.context.new_cdp_session(page)
        self.cdp.send("Performance.enable")
        self.cdp.send("Profiler.enable")

    def read(self) -> dict:
        metrics = {m["name"]: m["value"] for m in self.cdp.send("Performance.getMetrics")["metrics"]}
        return {"nodes": metrics.get("Nodes", 0), **{k: metrics.get(v, 0.0) for k, v in PAGE_METRICS.items()}}

    @staticmethod
    def spent(before: dict, after: dict) -> dict:
        """The page's seconds by kind between two reads, and its DOM nodes at the end."""
        return {"page_nodes": int(after["nodes"]), **{f"page_{k}_s": after[k] - before[k] for k in PAGE_METRICS}}

    @contextmanager
    def spending(self, profile: bool = False) -> Iterator[dict]:
        """What the page spends inside the block: the yielded dict gets ``spent``'s figures at its end, and with
        ``profile`` the page's JavaScript CPU profile (``page_profile``)."""
        spent, before = {}, self.read()
        if profile:
            self.cdp.send("Profiler.setSamplingInterval", {"interval": 200})  # microseconds
            self.cdp.send("Profiler.start")
        yield spent
        spent.update(self.spent(before, self.read()))
        if profile:
            spent["page_profile"] = self.cdp.send("Profiler.stop")["profile"]


def profile_top(profile: dict, n: int = 15) -> list[dict]:
    """A CPU profile's functions by self time (ms), the most first: name, script file and line."""
    nodes = {node["id"]: node for node in profile["nodes"]}
    deltas = profile.get("timeDeltas") or []
    spent: dict[tuple, float] = {}
    for sample, delta in zip(profile.get("samples") or [], deltas[1:] + [0]):
        frame = nodes[sample]["callFrame"]
        key = (frame["functionName"] or "(anonymous)", frame["url"].rsplit("/", 1)[-1], frame["lineNumber"] + 1)
        spent[key] = spent.get(key, 0.0) + delta / 1e3
    top = sorted(spent.items(), key=lambda kv: -kv[1])[:n]
    return [{"function": f, "file": u, "line": line, "self_ms": round(ms, 1)} for (f, u, line), ms in top]
