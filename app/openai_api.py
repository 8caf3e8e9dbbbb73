"""OpenAI-compatible routes on the app's own server: POST /v1/chat/completions and GET /v1/models.

They go through the same ChatEngine as the browser UI: the same semantic cache, and the same lock that lets
one decoding step at a time run on the models. ``create_server`` builds the FastAPI app with these routes and
mounts the Gradio Blocks at "/", so the UI and the API share one host and port.
"""
from __future__ import annotations

import hmac
import json
import logging
import queue
import threading
from collections.abc import Iterator

import gradio as gr
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.context import AppContext
from app.openai_format import (FINISH, OPENAI_TEMPERATURE, ChatCompletionRequest, Release, chunk_body,
                               completion_body, engine_messages, error_body, new_id, stop_strings, usage,
                               validation_error_body)
from engine.config import DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, SamplingConfig
from engine.errors import EngineError

log = logging.getLogger(__name__)
_END = object()


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def _sampling(req: ChatCompletionRequest) -> SamplingConfig:
    """The request's sampling; what it leaves out is OpenAI's default temperature, else the engine's defaults."""
    max_new_tokens = req.max_completion_tokens or req.max_tokens or DEFAULT_SAMPLING.max_new_tokens
    return SamplingConfig(temperature=OPENAI_TEMPERATURE if req.temperature is None else req.temperature,
                          top_p=DEFAULT_SAMPLING.top_p if req.top_p is None else req.top_p,
                          max_new_tokens=max_new_tokens, seed=req.seed)


def _start(ctx: AppContext, req: ChatCompletionRequest, cancel: threading.Event):
    """Check the request and pull the engine's first event, so bad input fails before any response starts.
    The same default proposer, adaptive k and cache as a browser chat."""
    messages, sampling, release = engine_messages(req), _sampling(req), Release(stop_strings(req))
    events = ctx.engine.generate(messages, sampling, DEFAULT_SPEC, cache=DEFAULT_CACHE, cancel=cancel)
    first = next(events)
    return release, first, events


def _model(ctx: AppContext) -> str:
    pair = ctx.pair()
    return pair["target"] if pair else "speclens"


def run_completion(ctx: AppContext, req: ChatCompletionRequest) -> dict:
    """A whole answer as one chat.completion body."""
    cancel = threading.Event()
    release, first, events = _start(ctx, req, cancel)
    speculation, cache, done = [], None, None
    for event in _chain(first, events):
        if event.type == "token":
            speculation += release.add(event)[1]
            if release.cut is not None:
                cancel.set()  # a stop string: the engine stops at its next step
        elif event.type == "cache":
            cache = event.to_dict()
        elif event.type == "done":
            done = event
    speculation += release.finish()[1]
    finish = "stop" if release.cut is not None else FINISH.get(done.finish_reason, "stop")
    return completion_body(new_id(), _model(ctx), release.released_text, finish, speculation,
                           usage(done.prompt_tokens, len(speculation), done.stats), cache)


def _chain(first, events: Iterator) -> Iterator:
    yield first
    yield from events


def _pump(events: Iterator, out: queue.Queue) -> None:
    """Run the engine's generator to its end on this thread, handing each event over."""
    try:
        for event in events:
            out.put(event)
    except Exception as err:  # the response has begun: no status is left to fail with, so the stream says it
        log.exception("generation failed mid-stream")
        out.put(err)
    finally:
        out.put(_END)


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def stream_completion(ctx: AppContext, req: ChatCompletionRequest):
    """Server-sent chat.completion.chunk events, then ``data: [DONE]``. A client that goes away cancels."""
    cancel = threading.Event()
    release, first, events = await run_in_threadpool(_start, ctx, req, cancel)
    cid, model = new_id(), _model(ctx)
    cache = first.to_dict() if first.type == "cache" else None
    handoff: queue.Queue = queue.Queue()

    async def body():
        n_tokens, done = 0, None
        threading.Thread(target=_pump, args=(_chain(first, events), handoff), daemon=True).start()
        try:
            yield _sse(chunk_body(cid, model, {"role": "assistant", "content": ""}, cache=cache))
            while (event := await run_in_threadpool(handoff.get)) is not _END:
                if isinstance(event, Exception):
                    yield _sse(error_body(f"generation failed: {event}", "server_error"))
                    break
                if event.type == "done":
                    done = event
                elif event.type == "token" and release.cut is None:
                    delta, spec = release.add(event)
                    n_tokens += len(spec)
                    if release.cut is not None:
                        cancel.set()
                    if delta or spec:
                        yield _sse(chunk_body(cid, model, {"content": delta}, spec))
            delta, spec = release.finish()
            n_tokens += len(spec)
            finish = "stop" if release.cut is not None or done is None else FINISH.get(done.finish_reason, "stop")
            use = usage(done.prompt_tokens, n_tokens, done.stats) if done else usage(0, n_tokens, None)
            yield _sse(chunk_body(cid, model, {"content": delta} if delta else {}, spec, finish, use))
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()  # the client left, or we are done: either way the engine stops

    return StreamingResponse(body(), media_type="text/event-stream")


def _auth(api_key: str | None):
    def check(request: Request) -> None:
        if not api_key:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                           code="invalid_api_key")
    return check


def add_openai_routes(app: FastAPI, ctx: AppContext, api_key: str | None = None) -> FastAPI:
    auth = [Depends(_auth(api_key))]

    @app.get("/v1/models", dependencies=auth)
    def list_models():
        pair = ctx.pair()
        roles = [] if pair is None else [("target", pair["target"], pair["target_precision"]),
                                         ("draft", pair["draft"], pair["draft_precision"])]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "speclens",
                                            "x_role": role, "x_precision": prec} for role, name, prec in roles]}

    @app.post("/v1/chat/completions", dependencies=auth)
    async def chat_completions(req: ChatCompletionRequest):
        if req.stream:
            return await stream_completion(ctx, req)
        return await run_in_threadpool(run_completion, ctx, req)

    add_error_handlers(app)
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every failure as OpenAI's error JSON, never a stack trace."""
    def respond(status: int, body: dict) -> JSONResponse:
        return JSONResponse(body, status_code=status)

    app.add_exception_handler(ApiError, lambda r, e: respond(e.status, error_body(e.message, e.kind, code=e.code)))
    app.add_exception_handler(EngineError, lambda r, e: respond(400, error_body(str(e))))
    app.add_exception_handler(RequestValidationError, lambda r, e: respond(422, validation_error_body(e.errors())))
    app.add_exception_handler(StarletteHTTPException,
                              lambda r, e: respond(e.status_code, error_body(str(e.detail), code=str(e.status_code))))
    app.add_exception_handler(Exception, lambda r, e: respond(
        500, error_body(f"internal error ({type(e).__name__})", "server_error")))


def create_server(ctx: AppContext, demo: gr.Blocks, api_key: str | None = None, **mount_kwargs) -> FastAPI:
    """One FastAPI app: the /v1 routes first, then the Gradio UI mounted at "/"."""
    app = add_openai_routes(FastAPI(docs_url=None, redoc_url=None, openapi_url=None), ctx, api_key)
    return gr.mount_gradio_app(app, demo, path="/", **mount_kwargs)
