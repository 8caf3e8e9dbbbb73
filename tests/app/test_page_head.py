"""app/api/page_head.py: the page's own script goes first in the HTML head, and nothing else is touched."""
from __future__ import annotations

import gzip

import pytest
from starlette.applications import Starlette
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from app.api.page_head import PAGE_SCRIPT, PageHead, script_tag

PAGE = "<!doctype html><html><head><script type=module src=app.js></script></head><body><head></head></body></html>"


def client(source: str = "window.first = 1;") -> TestClient:
    def page(request):
        return HTMLResponse(PAGE)

    def streamed(request):
        return StreamingResponse(iter([b"<head>", b"</head>"]), media_type="text/html")

    def compressed(request):
        return Response(gzip.compress(PAGE.encode()), media_type="text/html", headers={"content-encoding": "gzip"})

    routes = [Route("/", page, methods=["GET", "POST"]), Route("/api", lambda r: JSONResponse({"html": "<head>"})),
              Route("/streamed", streamed), Route("/gz", compressed)]
    return TestClient(PageHead(Starlette(routes=routes), source))


def test_an_html_page_gets_the_script_first_in_its_head_and_the_right_length():
    response = client().get("/")
    tag = "<script>window.first = 1;</script>"
    assert response.text == PAGE.replace("<head>", "<head>" + tag, 1)
    assert response.text.index(tag) < response.text.index("app.js")  # before the page's own scripts
    assert int(response.headers["content-length"]) == len(response.content)


def test_a_page_sent_in_parts_is_gathered_and_changed_once():
    assert client().get("/streamed").text == "<head><script>window.first = 1;</script></head>"


@pytest.mark.parametrize("method, path", [("get", "/api"), ("get", "/gz"), ("post", "/")])
def test_anything_but_a_plain_html_page_passes_untouched(method, path):
    response = getattr(client(), method)(path)
    assert b"window.first" not in response.content
    if path == "/gz":  # the client decoded it: the page as sent, not spliced into its compressed bytes
        assert response.text == PAGE


def test_a_script_that_would_close_its_own_tag_is_refused():
    with pytest.raises(ValueError, match="</script"):
        script_tag("let s = '</SCRIPT>';")


def test_the_shipped_script_is_what_the_server_puts_in():
    assert client(None).get("/").text.count(PAGE_SCRIPT.read_text(encoding="utf-8")) == 1
