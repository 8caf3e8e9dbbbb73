"""app/api/live_stream.py: a chat answer's frames over the app's own route, read as the page's script reads them."""
import json
import threading
import time

import httpx
import pytest

from app.api.live_stream import LiveStreams
from app.context import AppContext
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.helpers.fakes import FakeEngine, done, stats, tok


def test_a_stream_merges_what_its_reader_missed_and_ends_after_the_rest():
    streams = LiveStreams()
    stream = streams.open()
    assert stream.take(0) == {}  # nothing yet
    stream.push("<a>", md="1")
    stream.push("<b>", md="2", note="n")
    stream.push("", md="3")
    assert stream.take(0) == {"raw": "<a><b>", "md": "3", "note": "n"}
    stream.push("<c>")
    streams.end(stream)
    assert stream.take(0) == {"raw": "<c>"} and stream.take(0) is None
    assert streams.claim(stream.id) is None  # an ended answer cannot be claimed


def test_streams_nobody_reads_are_bounded():
    streams = LiveStreams(max_open=2)
    first, _, _ = streams.open(), streams.open(), streams.open()
    assert streams.claim(first.id) is None and first.take(0) is None  # the oldest unread one is closed


def test_the_route_streams_the_frames_to_their_first_reader_only():
    """Over HTTP on the app's real server (create_server, as launch.py builds it): the frames as lines of JSON while
    the answer streams, in order, then the end; the same URL again, or an unknown one, is a 404; a reader that leaves
    before the end leaves the stream abandoned (the answer's handler then stops the engine)."""
    ctx = AppContext(FakeEngine([], cache=False))
    stream = ctx.live.open()

    def answer():  # the handler's side: frames as the engine steps, then the end
        for i in range(5):
            time.sleep(0.05)
            stream.push(f"<span>{i}</span>", md=f"<p>{i}</p>")
        ctx.live.end(stream)

    with served(ctx) as url:
        writer = threading.Thread(target=answer)
        with httpx.stream("GET", url + stream.url, timeout=30) as response:
            assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
            writer.start()
            frames = [json.loads(line) for line in response.iter_lines() if line]
        writer.join()
        assert "".join(f.get("raw", "") for f in frames) == "".join(f"<span>{i}</span>" for i in range(5))
        assert frames[-1]["md"] == "<p>4</p>"
        assert httpx.get(url + stream.url, timeout=30).status_code == 404
        assert httpx.get(url + "speclens/live/nothing", timeout=30).status_code == 404
        assert not stream.abandoned  # read to its end

        left = ctx.live.open()  # a reader that goes away mid-answer (a closed tab) leaves the stream abandoned
        left.push("<span>0</span>")
        with httpx.stream("GET", url + left.url, timeout=30) as response:
            assert next(response.iter_lines()) == json.dumps({"raw": "<span>0</span>"})
        deadline = time.monotonic() + 30
        while not left.abandoned and time.monotonic() < deadline:
            left.push("<span>more</span>")  # the server learns of the leaving when it writes
            time.sleep(0.1)
        assert left.abandoned
        ctx.live.end(left)


class Endless(FakeEngine):
    """An answer that streams until its cancel flag is raised, a token and a step every 20 ms."""

    def generate(self, messages, sampling, spec, *, cancel=None, **kw):
        self.calls.append(dict(messages=messages, cancel=cancel))

        def steps():
            for i in range(20_000):
                if cancel.is_set():
                    break
                yield tok(f"w{i} ")
                yield stats()
                time.sleep(0.02)
            yield done(reason="cancelled" if cancel.is_set() else "length")
        return steps()


@pytest.mark.browser
@needs_chromium
def test_a_closed_tab_stops_its_answer():
    """Gradio closes a handler only where it yields, and the chat's handler yields only at an answer's start and end
    while its page reads the answer's stream: the tab closing ends that stream (assets/live.js's fetch, in real
    Chromium), and the handler raises the engine's cancel flag."""
    playwright = pytest.importorskip("playwright.sync_api")
    ctx = AppContext(Endless([], cache=False))
    with served(ctx) as url, playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            context = browser.new_context()
            page = context.new_page()
            page.goto(url)
            page.wait_for_selector("#msg textarea", timeout=60_000)
            page.fill("#msg textarea", "Tell me everything.")
            page.click("#send")
            page.wait_for_function("document.querySelectorAll('#chat-live [data-live-stream] .raw-view[data-shown] "
                                   ".tok').length >= 10", timeout=60_000)
            flag = ctx.engine.calls[-1]["cancel"]
            assert not flag.is_set()
            context.close()
            assert flag.wait(60), "the answer went on after its tab closed"
        finally:
            browser.close()


def served(ctx):
    """The app's real server (create_server, as launch.py builds it) on ``ctx``, in a thread; yields its URL."""
    from app.api.openai_routes import create_server
    from app.ui import build_demo, launch_kwargs
    from tests.helpers.server import serving

    return serving(create_server(ctx, build_demo(ctx), None, **launch_kwargs()))
