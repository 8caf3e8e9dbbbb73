"""``--api-key`` guards the whole server: the /v1 routes, the UI and Gradio's own API (/gradio_api/...).

A real server (the app's create_server, served by uvicorn in a thread) on a fake engine: no weights needed.
"""
from __future__ import annotations

import httpx
import pytest

from app.context import AppContext
from app.api.openai_routes import create_server
from app.ui import build_demo, launch_kwargs
from engine.surface import PairInfo
from tests.helpers.browser import CHROMIUM, CHROMIUM_ARGS, needs_chromium
from tests.helpers.constants import SMOL
from tests.helpers.fakes import FakeEngine
from tests.helpers.server import serving

KEY = "k3y-for-tests"
TARGET, DRAFT = "guarded-target-1.5b", "guarded-draft-0.5b"  # names that occur nowhere else in a page
# Gradio API endpoints that change the server's state, with inputs they accept
CHANGING = {"load_pair": [SMOL, "bf16", SMOL, "nf4"], "cache_clear": [],
            "cache_delete": [None]}


class NamedEngine(FakeEngine):
    """A FakeEngine whose loaded pair has names that a page can be searched for."""

    def info(self):
        return PairInfo(target=TARGET, draft=DRAFT, target_precision="bf16", draft_precision="nf4", device="cpu")


@pytest.fixture(scope="module")
def guarded():
    engine = NamedEngine([])
    ctx = AppContext(engine)
    with serving(create_server(ctx, build_demo(ctx), KEY, **launch_kwargs())) as url:
        yield url, engine


def login(url: str, password: str) -> httpx.Client:
    client = httpx.Client(base_url=url, timeout=30)
    client.post("login", data={"username": "someone", "password": password})
    return client


@pytest.mark.parametrize("name", list(CHANGING))
def test_gradio_api_calls_without_the_key_are_refused(guarded, name):
    url, engine = guarded
    entries_before = list(engine.entries)
    for client in (httpx.Client(base_url=url, timeout=30), login(url, "wrong")):
        r = client.post(f"gradio_api/call/{name}", json={"data": CHANGING[name]})
        assert r.status_code == 401, r.text
        assert client.post("gradio_api/queue/join", json={"data": CHANGING[name], "fn_index": 0,
                                                          "session_hash": "x"}).status_code == 401
    assert engine.entries == entries_before and not [c for c in engine.calls if "load" in c]


def test_the_ui_itself_needs_the_key(guarded):
    url, _ = guarded
    assert httpx.get(f"{url}config", timeout=30).status_code == 401  # the page's layout and handlers
    assert login(url, KEY).get("config").status_code == 200


@pytest.mark.parametrize("name", list(CHANGING))
def test_gradio_api_calls_with_the_key_are_accepted(guarded, name):
    url, _ = guarded
    r = login(url, KEY).post(f"gradio_api/call/{name}", json={"data": CHANGING[name]})
    assert r.status_code == 200 and r.json()["event_id"], r.text


def test_gradio_client_with_the_key_runs_the_calls(guarded):
    from gradio_client import Client

    url, engine = guarded
    client = Client(url, auth=("someone", KEY), verbose=False)
    client.predict(*CHANGING["load_pair"], api_name="/load_pair")
    assert {"load": (SMOL, SMOL, "bf16", "nf4")} in engine.calls
    client.predict(api_name="/cache_clear")
    assert engine.entries == []
    with pytest.raises(Exception):
        Client(url, verbose=False)  # without the key gradio_client cannot even read the API


def test_the_v1_routes_need_the_bearer_key_not_the_ui_login(guarded):
    url, _ = guarded
    assert login(url, KEY).get("v1/models").status_code == 401
    r = httpx.get(f"{url}v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == TARGET


def test_a_page_without_the_key_names_no_endpoint_and_no_model(guarded):
    """Gradio embeds its API description (each endpoint with its defaults: the loaded pair) in every page, the
    login page too; served without the key, a page has none of it. With the key the app's page still has it."""
    url, _ = guarded
    client = login(url, KEY)
    endpoints = list(client.get("gradio_api/info").json()["named_endpoints"])
    assert "/load_pair" in endpoints and TARGET in client.get("").text
    for path in ("", "?page=", "gradio_api/runs", "login"):
        r = httpx.get(f"{url}{path}", timeout=30)
        assert r.status_code in (200, 404, 405), (path, r.status_code)
        leaked = [word for word in (*endpoints, TARGET, DRAFT, "bf16", "nf4", "named_endpoints") if word in r.text]
        assert not leaked, (path, leaked)
    page = httpx.get(url, timeout=30)
    assert "auth_required" in page.text and int(page.headers["content-length"]) == len(page.content)


@pytest.mark.browser
@needs_chromium
def test_a_browser_logs_in_with_the_key_and_gets_the_app(guarded):
    """Headless Chromium: the page asks for the login; a wrong key is refused, the key opens the app."""
    playwright = pytest.importorskip("playwright.sync_api")
    url, _ = guarded
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(url)
        for password in ("wrong", KEY):
            page.get_by_label("username").fill("someone")
            page.get_by_label("password").fill(password)
            page.get_by_role("button", name="Login").click()
            if password == "wrong":
                playwright.expect(page.get_by_text("Incorrect Credentials")).to_be_visible(timeout=30_000)
        playwright.expect(page.locator("#msg textarea")).to_be_visible(timeout=60_000)
        browser.close()
