"""app/ui.py: the whole Blocks builds from its tabs without an engine's models, torch or transformers."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_building_the_ui_imports_no_torch():
    """Not only the imports: building the whole Blocks (dropdown choices, defaults, handlers) stays torch-free."""
    subprocess.run([sys.executable, "-m", "tests.helpers.build_ui"], cwd=REPO, check=True, timeout=300)


def test_the_served_page_keeps_no_run_history():
    """Gradio 6.31 records every run's inputs and outputs (prompts, answers) in the browser's localStorage and rewrites
    the list at each streamed frame unless the app says no: the served config says no, and the runs page is gone."""
    import httpx

    from app.api.openai_routes import create_server
    from app.context import AppContext
    from app.ui import build_demo, launch_kwargs
    from tests.helpers.fakes import FakeEngine
    from tests.helpers.server import serving

    ctx = AppContext(FakeEngine([], cache=False))
    with serving(create_server(ctx, build_demo(ctx), None, **launch_kwargs())) as url:
        config = httpx.get(f"{url}config", timeout=30).json()
        assert config["run_history"] is False
        assert "runs" not in config.get("footer_links", [])
        assert httpx.get(f"{url}gradio_api/runs", timeout=30).status_code == 404


def test_nothing_on_the_page_animates_its_layout():
    """The stats panel is redrawn 5 times a second while an answer streams: a transition on a box's size (the
    break-even meter's width had one) restarts at every redraw, never ends, and lays the whole page out at every
    display frame on the cores the model decodes on (Chromium 22 -> 14 ms of CPU a token without it, docs/bench.md).
    The stylesheet has no transition, and its only animations change opacity (the streaming cursor's blink)."""
    import re

    css = re.sub(r"/\*.*?\*/", "", (REPO / "assets" / "style.css").read_text(encoding="utf-8"), flags=re.S)
    assert not re.search(r"\btransition(-property)?\s*:", css)
    keyframes = re.findall(r"@keyframes\s+[\w-]+\s*\{((?:[^{}]*\{[^{}]*\})*)\s*\}", css)
    assert keyframes, "the streaming cursor's blink is the one animation"
    properties = {name.strip() for body in keyframes for name in re.findall(r"([\w-]+)\s*:", body)}
    assert properties == {"opacity"}, properties


def test_what_follows_an_answer_is_not_queued():
    """Gradio 6.31's page closes its event stream when the queue holds none of its events, and a message submitted
    as it closes can find the stream marked open, open none and wait forever (its events are never read). An answer's
    join into the chat and the cache view's refresh after it ran on the queue, each closing the stream, so the next
    message sent as the answer showed hung (tests/app/test_browser.py sends it then): every event chained after a
    queued answer runs without the queue, and only the answer's own event closes the stream."""
    from app.context import AppContext
    from app.ui import build_demo
    from tests.helpers.fakes import FakeEngine

    dependencies = build_demo(AppContext(FakeEngine([], cache=False))).get_config_file()["dependencies"]
    by_id = {d["id"]: d for d in dependencies}
    answers = [d for d in dependencies if d.get("api_name") in ("send", "regenerate")]
    assert len(answers) == 2 and all(d["queue"] is not False for d in answers)

    def root(d):
        while d.get("trigger_after") is not None:
            d = by_id[d["trigger_after"]]
        return d

    chained = [d for d in dependencies if d.get("trigger_after") is not None and root(d) in answers]
    assert len(chained) >= 4, "the joins and the cache view's refreshes follow each answer"
    assert [d["api_name"] for d in chained if d["queue"] is not False] == []
