"""Chat handlers: send, regenerate, stop, clear, export. They stream engine events into HTML."""
from __future__ import annotations

import contextlib
import tempfile
import time
from dataclasses import replace
from itertools import chain

import gradio as gr

from app import toast
from app.components import read_settings
from app.context import AppContext, session_id
from app.views.render import error_html, error_message, info_html, render_user
from app.settings import UISettings, cache_config, sampling_config, spec_config
from app.views.stats import acceptance_frame, render_stats, speedup_frame
from app.turn import Turn, trace_document, write_trace
from engine.errors import EngineError

PLOT_EVERY_S = 1.0  # plots redraw at most this often while streaming; the numbers update every step


def _fail(elems: dict, err: EngineError) -> dict:
    message = error_message(err)
    toast.warn(message)
    return {elems["error_box"]: error_html(message)}


def _start(ctx: AppContext, messages: list[dict], s: UISettings, flag):
    """Build configs and pull the first event, so bad input fails here, before the chat changes."""
    sampling, spec = sampling_config(s), spec_config(s)
    if ctx.baseline() is None and ctx.pair() is not None:
        ctx.ensure_baseline()  # measured once per pair (the engine holds no lock between steps: any order works)
    events = ctx.engine.generate(messages, sampling, spec, cache=cache_config(s), cancel=flag)
    first = next(events, None)
    return events, ([] if first is None else [first])


def stream_answer(ctx: AppContext, elems: dict, *, history: list[dict], shown: list, prompt: str,
                  settings: UISettings, session: str):
    """Generator of component updates: the answer to ``prompt`` streamed into the chat, stats and plots.

    Closing it (the Stop button's ``cancels=``, a closed tab) sets the engine's cancel flag: generation
    stops at its next step.
    """
    with ctx.cancels.running(session) as flag:
        yield from _stream_answer(ctx, elems, history=history, shown=shown, prompt=prompt, s=settings, flag=flag)


def _stream_answer(ctx: AppContext, elems: dict, *, history: list[dict], shown: list, prompt: str,
                   s: UISettings, flag):
    messages = [*history, {"role": "user", "content": prompt}]
    try:
        events, head = _start(ctx, messages, s, flag)
    except EngineError as err:  # bad input: said in the error box, the chat stays as it was
        yield _fail(elems, err)
        return
    turn, baseline, last_plot = Turn(), ctx.baseline(), 0.0
    doc = trace_document(turn, messages, ctx.pair(), s.to_dict())
    shown = [*shown, {"role": "user", "content": render_user(prompt)},
             {"role": "assistant", "content": turn.html(streaming=True)}]
    yield {elems["msg"]: "", elems["error_box"]: error_html(None), elems["chatbot"]: shown}
    with contextlib.closing(events):
        for event in chain(head, events):
            turn.add(event)
            if event.type == "token":
                continue  # a StatsEvent follows every step: redraw once per step
            finished = event.type == "done"
            shown[-1] = {"role": "assistant", "content": turn.html(streaming=not finished)}
            update = {elems["chatbot"]: shown, elems["shown"]: shown, elems["trace"]: doc,
                      elems["history"]: [*messages, {"role": "assistant", "content": turn.text}],
                      elems["stats"]: render_stats(turn.stats, turn.cache, baseline, _status(turn))}
            if turn.stats is not None and (finished or time.monotonic() - last_plot > PLOT_EVERY_S):
                last_plot = time.monotonic()
                update[elems["accept_plot"]] = acceptance_frame(turn.stats)
                update[elems["speed_plot"]] = speedup_frame(turn.stats, baseline)
            yield update


def _status(turn: Turn) -> str:
    if turn.done is None:
        return "streaming…" if turn.cache is None else f"streaming… (cache: {turn.cache.outcome})"
    counts = ", ".join(f"{n} {kind}" for kind, n in turn.kind_counts().items())
    head = "stopped by you" if turn.done.finish_reason == "cancelled" else f"done ({turn.done.finish_reason})"
    return f"{head}: {len(turn.done.token_ids)} tokens in {turn.done.stats.elapsed_s:.1f} s — {counts}"


def make_handlers(ctx: AppContext, elems: dict) -> dict:
    """Closures over the context and the components, ready for event listeners."""

    def send(data: dict, request: gr.Request):
        s = read_settings(elems, data)
        yield from stream_answer(ctx, elems, history=data[elems["history"]] or [], shown=data[elems["shown"]] or [],
                                 prompt=data[elems["msg"]] or "", settings=s, session=session_id(request))

    def regenerate(data: dict, request: gr.Request):
        history, shown = data[elems["history"]] or [], data[elems["shown"]] or []
        if len(history) < 2 or history[-1]["role"] != "assistant":
            toast.warn("nothing to regenerate yet: send a message first")
            yield {elems["error_box"]: error_html("nothing to regenerate yet: send a message first")}
            return
        prompt = history[-2]["content"]
        fresh = replace(read_settings(elems, data), cache_enabled=False)  # a new answer, not the cached one
        yield from stream_answer(ctx, elems, history=history[:-2], shown=shown[:-2], prompt=prompt, settings=fresh,
                                 session=session_id(request))

    def stop(request: gr.Request):
        """Only raise the cancel flag: the engine ends at its next step with finish reason "cancelled", and the
        answer's own stream writes the last update ("stopped by you"), so no late update can undo it."""
        if ctx.cancels.cancel(session_id(request)):
            return info_html("Stopping at the next step…")
        return info_html("Nothing is running.")

    def clear(request: gr.Request):
        ctx.cancels.cancel(session_id(request))
        empty_stats = render_stats(None, None, ctx.baseline())
        return ([], [], [], {}, error_html(None), empty_stats, acceptance_frame(None), speedup_frame(None, None),
                gr.update(value=None, visible=False))

    def export(trace: dict):
        return export_trace_file(trace, prefix="speclens-trace-", nothing="no answer to export yet")

    return dict(send=send, regenerate=regenerate, stop=stop, clear=clear, export=export)


def export_trace_file(trace: dict, *, prefix: str, nothing: str):
    """The download button's update: the trace as a JSON file, or a warning when there is nothing yet."""
    if not trace or not trace.get("events"):
        toast.warn(nothing)
        return gr.update(value=None, visible=False)
    path = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".json", delete=False).name
    return gr.update(value=write_trace(trace, path), visible=True)
