"""The API key (``launch.py --api-key``): when set, it guards the whole server.

- The OpenAI routes (/v1/...): ``Authorization: Bearer KEY``. An ASGI middleware checks it before the request
  is read, so nothing about a request without the key (not even malformed JSON) is looked at: it gets 401.
- The browser UI and Gradio's own API (/gradio_api/..., gradio_client): Gradio's login, with any user name and
  the key as the password (``Client(url, auth=("me", KEY))``).
"""
from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from app.api.openai_format import error_body

API_PREFIX = "/v1"


def key_matches(given: str, api_key: str) -> bool:
    """Constant-time comparison, so the time taken says nothing about how much of the key was right."""
    return hmac.compare_digest(given.encode(), api_key.encode())


def is_api_path(path: str) -> bool:
    return path == API_PREFIX or path.startswith(API_PREFIX + "/")


class BearerKeyMiddleware:
    """401 in OpenAI's error format for any /v1 request without ``Authorization: Bearer <api_key>``."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and is_api_path(scope["path"]):
            given = Headers(scope=scope).get("authorization", "")
            if not key_matches(given, self.expected):
                body = error_body("missing or wrong API key: send 'Authorization: Bearer <key>'",
                                  code="invalid_api_key")
                await JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
                return
        await self.app(scope, receive, send)


def gradio_login(api_key: str) -> Callable[[str, str], bool]:
    """Gradio's ``auth``: any user name, the key as the password."""
    def check(username: str, password: str) -> bool:
        return key_matches(password or "", api_key)
    return check
