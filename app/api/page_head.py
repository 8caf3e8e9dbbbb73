"""A script first in the page's ``<head>``, before Gradio's own (assets/page.js).

Gradio adds a Blocks' ``head`` to the page only once its config has loaded, after its modules have run; what must
change how those modules behave (assets/page.js spaces the frames of a loop they start while the page loads) has to
run before them, so it goes into the HTML the server sends. A plain ASGI middleware: an HTML page (``text/html``, not
compressed) gets the script right after its ``<head>``, its length corrected; every other response passes untouched,
streamed ones included.
"""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_SCRIPT = Path(__file__).resolve().parents[2] / "assets" / "page.js"
HEAD = b"<head>"


def script_tag(source: str) -> bytes:
    """``source`` as an inline script; a ``</script>`` inside it could end the tag early, so none may be there."""
    if "</script" in source.lower():
        raise ValueError("an inline script cannot contain '</script'")
    return f"<script>{source}</script>".encode()


def html_rewritten(send: Send, rewrite: Callable[[bytes], tuple[int | None, bytes]]) -> Send:
    """``send`` for one response: an HTML one (``text/html``, not compressed) is held back until its whole body is
    in and goes out as ``rewrite(body)`` says (a new status or None, the new body), its Content-Length following;
    other responses, streamed ones included, pass as they come."""
    held: list[Message] = []

    async def filtered(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = Headers(raw=message["headers"])
            if headers.get("content-type", "").startswith("text/html") and "content-encoding" not in headers:
                held.append(message)
                return
        if not held or message["type"] != "http.response.body":
            await send(message)
            return
        held.append(message)
        if message.get("more_body"):
            return
        start, body = held[0], b"".join(m.get("body", b"") for m in held[1:])
        status, page = rewrite(body)
        headers = start["headers"]
        if body:  # a HEAD response has none, and keeps the headers of its GET
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
            headers.append((b"content-length", str(len(page)).encode()))
        await send({**start, "status": status or start["status"], "headers": headers})
        await send({"type": "http.response.body", "body": page})
    return filtered


class PageHead:
    """Puts ``script_tag(source)`` right after the ``<head>`` of every HTML page ``app`` serves."""

    def __init__(self, app: ASGIApp, source: str | None = None):
        self.app = app
        self.tag = script_tag(PAGE_SCRIPT.read_text(encoding="utf-8") if source is None else source)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        def rewrite(body: bytes) -> tuple[None, bytes]:
            return None, body.replace(HEAD, HEAD + self.tag, 1)
        await self.app(scope, receive, html_rewritten(send, rewrite))
