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


def test_nothing_on_the_page_animates():
    """The stats panel is redrawn once a second while an answer streams: a transition on a box's size (the
    break-even meter's width had one) restarts at every redraw, never ends, and lays the whole page out at every
    display frame on the cores the model decodes on (Chromium 22 -> 14 ms of CPU a token without it, docs/bench.md).
    The stylesheet has no transition and no animation: the streaming cursor's blink (an opacity animation) kept the
    compositor drawing frames for as long as an answer streamed (docs/bench.md, "The answer's own stream")."""
    import re

    css = re.sub(r"/\*.*?\*/", "", (REPO / "assets" / "style.css").read_text(encoding="utf-8"), flags=re.S)
    assert not re.search(r"\btransition(-property)?\s*:", css)
    assert not re.search(r"@keyframes|\banimation(-name)?\s*:", css)


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


def test_no_event_tracks_its_progress_on_a_value_that_grows():
    """Gradio's page keeps a loading status for every component that was ever a progress target of an event that ran
    (its ``show_progress_on``, or every output when that is None) and, at every message of every event, reads a
    snapshot of each of them, its whole value included (app/tabs/engine_queue.py). The chat, written once per answer
    by the join, was a progress target: every frame of every later answer cloned the whole conversation (on 2 cores,
    4.5k clones an answer at the first answer, 21k at the sixth; flat after). No event tracks progress on a component
    whose value grows with the conversation, the cache or an experiment: the chat, the race's answers, a table or a
    plot; the events that write them track none, or a status line."""
    from app.context import AppContext
    from app.ui import build_demo
    from tests.helpers.fakes import FakeEngine

    config = build_demo(AppContext(FakeEngine([], cache=False))).get_config_file()
    kinds = {c["id"]: (c["type"], c.get("props", {}).get("elem_id")) for c in config["components"]}
    growing = {"chatbot", "dataframe", "plot", "lineplot", "barplot", "scatterplot"}
    race_views = {"race-target", "race-spec", "chat"}  # the chat: the page keeps what its writes append
    tracked = {}
    for d in config["dependencies"]:
        targets = d["outputs"] if d.get("show_progress_on") is None else d["show_progress_on"]
        tracked[d["id"]] = [kinds[t] for t in targets if t in kinds]
    writes_growing = [d for d in config["dependencies"]
                      if any(kinds[t][0] in growing or kinds[t][1] in race_views for t in d["outputs"])]
    assert len(writes_growing) >= 5, "the chat's joins and clear, the cache view's refreshes, the experiments"
    bad = {d_id: [k for k in ks if k[0] in growing or k[1] in race_views] for d_id, ks in tracked.items()}
    assert {d_id: ks for d_id, ks in bad.items() if ks} == {}
    joins = [d for d in config["dependencies"] if d.get("api_name", "").startswith("join")]
    assert len(joins) == 2 and all(tracked[d["id"]] == [] for d in joins)
