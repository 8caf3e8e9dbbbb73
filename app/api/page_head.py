"""A script first in the page's ``<head>``, before Gradio's own (assets/page.js).

Gradio adds a Blocks' ``head`` to the page only once its config has loaded, after its modules have run; what must
change how those modules behave (assets/page.js spaces the frames of a loop they start while the page loads) has to
run before them, so it goes into the HTML the server sends. A plain ASGI middleware: an HTML page (``text/html``, not
compressed) gets the script right after its ``<head>``, its length corrected; every other response passes untouched,
streamed ones included.
"""
from __future__ import annotations

from pathlib import Path

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PAGE_SCRIPT = Path(__file__).resolve().parents[2] / "assets" / "page.js"
HEAD = b"<head>"


def script_tag(source: str) -> bytes:
    """``source`` as an inline script; a ``</script>`` inside it could end the tag early, so none may be there."""
    if "</script" in source.lower():
        raise ValueError("an inline script cannot contain '</script'")
    return f"<script>{source}</script>".encode()


class PageHead:
    """Puts ``script_tag(source)`` right after the ``<head>`` of every HTML page ``app`` serves."""

    def __init__(self, app: ASGIApp, source: str | None = None):
        self.app = app
        self.tag = script_tag(PAGE_SCRIPT.read_text(encoding="utf-8") if source is None else source)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET":
            await self.app(scope, receive, send)
            return
        held: list[Message] = []  # the response's start, while its HTML body is gathered
        parts: list[bytes] = []

        async def send_page(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(raw=message["headers"])
                if headers.get("content-type", "").startswith("text/html") and "content-encoding" not in headers:
                    held.append(message)
                    return
            elif message["type"] == "http.response.body" and held:
                parts.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = b"".join(parts).replace(HEAD, HEAD + self.tag, 1)
                start = held.pop()
                MutableHeaders(raw=start["headers"])["content-length"] = str(len(body))
                await send(start)
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, send_page)
