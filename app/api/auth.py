"""The API key (``launch.py --api-key``): when set, it guards the whole server.

- The OpenAI routes (/v1/...): ``Authorization: Bearer KEY``. An ASGI middleware checks it before the request
  is read, so nothing about a request without the key (not even malformed JSON) is looked at: it gets 401.
- The browser UI and Gradio's own API (/gradio_api/..., gradio_client): Gradio's login, with any user name and
  the key as the password (``Client(url, auth=("me", KEY))``).
- The login page, and any page Gradio serves to a visitor without the key, says nothing about the app: Gradio
  embeds its API description in every page (each named endpoint with its defaults, the loaded models among
  them), login page included, while /gradio_api/info refuses the same visitor. ``login_page_only`` takes it out.
"""
from __future__ import annotations

import hmac
import re
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.openai_format import error_body
from app.api.page_head import html_rewritten

API_PREFIX = "/v1"
# What Gradio puts in a page for a visitor who is not logged in (the login page): its config says so first
LOGIN_PAGE = b'window.gradio_config = {"auth_required":true'
# Gradio's API description in a page; its JSON escapes "<", so the first ";</script>" ends it
API_INFO = re.compile(rb"(<script>window\.gradio_api_info = ).*?(;</script>)", re.DOTALL)
WITHHELD = b"SpecLens withheld this login page: it still describes the app's API (see app/api/auth.py)"


def key_matches(given: str, api_key: str) -> bool:
    """Constant-time comparison, so the time taken says nothing about how much of the key was right."""
    return hmac.compare_digest(given.encode(), api_key.encode())


def is_api_path(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


class BearerKeyMiddleware:
    """The key's guard in front of the whole server: 401 in OpenAI's error format for any /v1 request without
    ``Authorization: Bearer <api_key>``; every other request goes on to the UI (Gradio's login), and a page
    served to a visitor without the key goes out without the app's API description (``login_page_only``)."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
        elif not is_api_path(scope["path"]):
            await self.app(scope, receive, login_page_only(send))
        elif key_matches(Headers(scope=scope).get("authorization", ""), self.expected):
            await self.app(scope, receive, send)
        else:
            body = error_body("missing or wrong API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
            await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)


def without_api_info(page: bytes) -> bytes | None:
    """A login page with Gradio's API description emptied (``null``: Gradio's page then asks /gradio_api/info, which
    needs the login); any other page as it is. None when a login page would still describe the API: a Gradio
    that embeds it some other way is refused, not served."""
    if LOGIN_PAGE not in page:
        return page
    page = API_INFO.sub(rb"\1null\2", page)
    return None if b"named_endpoints" in page else page


def login_page_only(send: Send) -> Send:
    """``send`` for one response: an HTML page goes out without the app's API description (``without_api_info``),
    or as a 500 when it cannot be taken out; other responses pass as they come."""
    def rewrite(body: bytes) -> tuple[int | None, bytes]:
        page = without_api_info(body)
        return (None, page) if page is not None else (500, WITHHELD)
    return html_rewritten(send, rewrite)


def gradio_login(api_key: str) -> Callable[[str, str], bool]:
    """Gradio's ``auth``: any user name, the key as the password."""
    def check(username: str, password: str) -> bool:
        return key_matches(password or "", api_key)
    return check
