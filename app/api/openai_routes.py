"""OpenAI-compatible routes on the app's own server: POST /v1/chat/completions and GET /v1/models.

They go through the same ChatEngine as the browser UI: the same semantic cache, and the same lock that lets
one decoding step at a time run on the models. ``create_server`` builds the FastAPI app with these routes and
mounts the Gradio Blocks at "/", so the UI and the API share one host and port; with an API key, both are
behind it (app/api/auth.py). A client that leaves stops its generation, streamed or not.
"""
from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Iterator
from itertools import chain

import gradio as gr
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.routing import APIRoute
from starlette.concurrency import iterate_in_threadpool, run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from app.api.auth import API_PREFIX, BearerKeyMiddleware, gradio_login
from app.api.live_stream import add_live_route
from app.api.openai_format import (Answer, ApiError, Piece, Release, chunk_body, completion_body, error_body, joined,
                                   new_id, usage_chunk, validation_error_body)
from app.api.openai_request import (ChatCompletionRequest, check_request, engine_messages, memory_scope, prediction_text,
                                    sampling_of, stop_strings)
from app.api.page_head import PageHead
from app.api.queue_pace import pace_queue
from app.context import AppContext
from engine.config import DEFAULT_CACHE, DEFAULT_SPEC
from engine.errors import EngineError

log = logging.getLogger(__name__)


HTTP_METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]


def _start(ctx: AppContext, req: ChatCompletionRequest, cancel: threading.Event):
    """Check the request and pull the engine's first event, so bad input fails before any response starts.
    The same default proposer, adaptive k and cache as a browser chat; a ``prediction`` drafts first."""
    check_request(req)
    messages, sampling, prediction = engine_messages(req), sampling_of(req), prediction_text(req)
    answer = Answer(Release(stop_strings(req)), logprobs=bool(req.logprobs))
    events = ctx.engine.generate(messages, sampling, DEFAULT_SPEC, cache=DEFAULT_CACHE, cancel=cancel,
                                 prediction=prediction, memory_scope=memory_scope(req))
    first = next(events)
    return answer, first, events


def _model(ctx: AppContext) -> str:
    pair = ctx.pair()
    return pair.target if pair else "speclens"


def x_identity(ctx: AppContext) -> dict | None:
    """The pair's identity check, measured on this machine beside serving (``x_identity``): is greedy speculation
    bit-for-bit the target's output here, what the check found, and when and how it was measured (``measuring``
    until it is in); where identity holds only up to some verify width, the verify mode (``identical``: a request
    with adaptive k keeps to that width) and what each mode costs."""
    pair = ctx.pair()
    if pair is None:
        return None
    found = {"bit_identical": pair.bit_identical, "check": pair.identity_note, "measuring": pair.measuring,
             "measured": pair.checks_note}
    return {**found, "verify_mode": pair.verify_mode, "verify": pair.verify_note} if pair.verify_mode else found


def released(answer: Answer, events: Iterator) -> Iterator[Piece]:
    """The one path from events to the response: what each event releases to the client (text, speculation and
    logprobs entries), when it releases anything. The engine stops by itself at a stop string (the request's
    SamplingConfig.stop), so nothing is decoded past one; its last events (the DoneEvent) still come through."""
    for event in events:
        piece = answer.add(event)
        if piece.text or piece.speculation:
            yield piece


def run_completion(ctx: AppContext, req: ChatCompletionRequest, cancel: threading.Event) -> dict:
    """A whole answer as one chat.completion body; setting ``cancel`` stops the engine at its next step."""
    answer, first, events = _start(ctx, req, cancel)
    whole = joined([*released(answer, chain([first], events)), answer.finish()])
    if answer.done.finish_reason == "cancelled" and not answer.stopped:
        log.warning("the client left before its answer was complete: stopped after %d tokens",
                    len(answer.done.token_ids))
    return completion_body(new_id(), _model(ctx), answer.text, answer.finish_reason(), whole, answer.usage(),
                           answer.cache, x_identity(ctx))


async def while_connected(request: Request, cancel: threading.Event, work, *args):
    """``work(*args)`` on a worker thread, while watching the connection: a client that hangs up sets ``cancel``
    (the request body has been read, so the next message the server has for us is the disconnect)."""
    async def watch() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        cancel.set()

    watcher = asyncio.ensure_future(watch())
    try:
        return await run_in_threadpool(work, *args)
    finally:
        watcher.cancel()


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


def sse_chunks(answer: Answer, first, events: Iterator, cancel: threading.Event, cid: str, model: str,
               include_usage: bool = False, checked: dict | None = None) -> Iterator[str]:
    """The streamed response, one server-sent event at a time: the role (with the cache outcome, the ``first``
    event, and ``checked``: the pair's identity check), a chunk per release, the last chunk with the finish reason, with ``include_usage`` a chunk with no
    choices and the usage, then ``data: [DONE]``."""
    def chunk(delta: dict, piece: Piece | None = None, **kw) -> str:
        return _sse(chunk_body(cid, model, delta, piece, null_usage=include_usage, **kw))

    yield chunk({"role": "assistant", "content": ""}, cache=first.to_dict() if first.type == "cache" else None,
                x_identity=checked)
    try:
        for piece in released(answer, chain([first], events)):
            yield chunk({"content": piece.text}, piece)
    except Exception as err:  # the response has begun: no status is left to fail with, so the stream says it
        log.exception("generation failed mid-stream")
        yield _sse(error_body(f"generation failed: {err}", "server_error"))
    piece = answer.finish()
    yield chunk({"content": piece.text} if piece.text else {}, piece, finish_reason=answer.finish_reason())
    if include_usage:
        yield _sse(usage_chunk(cid, model, answer.usage()))
    yield "data: [DONE]\n\n"


async def stream_completion(ctx: AppContext, req: ChatCompletionRequest):
    """Server-sent chat.completion.chunk events, then ``data: [DONE]``. The engine decodes on its own worker
    (ChatEngine.generate), so a slow client costs it nothing; each chunk is read here on a worker thread
    (Starlette's ``iterate_in_threadpool``). A client that goes away sets ``cancel``: the engine stops at its next
    step and ends its own way (its DoneEvent, the cache's bookkeeping) with nobody reading."""
    cancel = threading.Event()
    answer, first, events = await run_in_threadpool(_start, ctx, req, cancel)
    include_usage = bool(req.stream_options and req.stream_options.include_usage)
    chunks = sse_chunks(answer, first, events, cancel, new_id(), _model(ctx), include_usage, x_identity(ctx))

    async def body():
        try:
            async for chunk in iterate_in_threadpool(chunks):
                yield chunk
        finally:  # the client left, or we are done: either way the engine stops at its next step
            cancel.set()

    return StreamingResponse(body(), media_type="text/event-stream")


def add_openai_routes(app: FastAPI, ctx: AppContext, api_key: str | None = None) -> FastAPI:
    """The /v1 routes, behind ``api_key`` when one is given (checked before anything else, app/api/auth.py)."""
    if api_key:
        app.add_middleware(BearerKeyMiddleware, api_key=api_key)

    @app.get("/v1/models")
    def list_models():
        pair = ctx.pair()
        roles = [] if pair is None else [("target", pair.target, pair.target_precision),
                                         ("draft", pair.draft, pair.draft_precision)]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "speclens",
                                            "x_role": role, "x_precision": prec, "x_runner": pair.runner,
                                            "x_precision_note": pair.precision_note,
                                            **({"x_identity": x_identity(ctx)} if role == "target" else {})}
                                           for role, name, prec in roles]}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatCompletionRequest, request: Request):
        if req.stream:
            return await stream_completion(ctx, req)
        cancel = threading.Event()
        return await while_connected(request, cancel, run_completion, ctx, req, cancel)

    @app.api_route(API_PREFIX, methods=HTTP_METHODS, include_in_schema=False)
    @app.api_route(API_PREFIX + "/{rest:path}", methods=HTTP_METHODS, include_in_schema=False)
    def no_such_route(request: Request):
        """Last of the /v1 routes (before the UI mounted at "/" could answer): OpenAI's 404 or a 405."""
        path = request.url.path
        allowed = sorted({m for r in app.routes if isinstance(r, APIRoute) and r.path == path
                          and r.endpoint is not no_such_route for m in r.methods})
        if allowed:
            raise ApiError(405, f"{request.method} is not allowed on {path}; use {', '.join(allowed)}",
                           code="method_not_allowed", headers={"Allow": ", ".join(allowed)})
        raise ApiError(404, f"Invalid URL ({request.method} {path}): the routes are POST /v1/chat/completions "
                            "and GET /v1/models", code="unknown_url")

    add_error_handlers(app)
    return app


def add_error_handlers(app: FastAPI) -> None:
    """Every failure as OpenAI's error JSON, never a stack trace."""
    def respond(status: int, body: dict) -> JSONResponse:
        return JSONResponse(body, status_code=status)

    app.add_exception_handler(ApiError, lambda r, e: JSONResponse(error_body(e.message, e.kind, e.param, e.code),
                                                                  status_code=e.status, headers=e.headers))
    app.add_exception_handler(EngineError, lambda r, e: respond(400, error_body(str(e))))
    app.add_exception_handler(RequestValidationError, lambda r, e: respond(422, validation_error_body(e.errors())))
    app.add_exception_handler(StarletteHTTPException,
                              lambda r, e: respond(e.status_code, error_body(str(e.detail), code=str(e.status_code))))
    app.add_exception_handler(Exception, lambda r, e: respond(
        500, error_body(f"internal error ({type(e).__name__})", "server_error")))


def create_server(ctx: AppContext, demo: gr.Blocks, api_key: str | None = None, **mount_kwargs) -> FastAPI:
    """One FastAPI app: the /v1 routes first, then the Gradio UI mounted at "/", behind Gradio's login when
    there is an ``api_key``."""
    app = add_openai_routes(FastAPI(docs_url=None, redoc_url=None, openapi_url=None), ctx, api_key)
    add_live_route(app, ctx.live)  # the chat answers' frames, beside Gradio's messages (app/api/live_stream.py)
    auth = gradio_login(api_key) if api_key else None
    app = gr.mount_gradio_app(app, demo, path="/", auth=auth,
                              auth_message="Log in with any user name and the API key as the password.", **mount_kwargs)
    app.add_middleware(PageHead)  # assets/page.js first in the page, before Gradio's scripts
    pace_queue(demo._queue)  # its job and progress loops wake 100 and 10 times a second, not 1000 and 100
    return app
