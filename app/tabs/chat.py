"""The Chat tab: the conversation with each answer token coloured by how it was produced, and the live
statistics beside it. Send, regenerate, stop, clear and export stream engine events into HTML."""
from __future__ import annotations

import contextlib
import tempfile
import uuid
from dataclasses import dataclass, replace
from itertools import chain
from pathlib import Path

import gradio as gr

from app import toast
from app.context import AppContext, session_id
from app.examples import example_inputs, example_labels
from app.live import PANEL_S, Frames, LiveDraw, live_box, live_start
from app.settings import UISettings, cache_config, sampling_config, spec_config
from app.tabs.controls import Controls
from app.tabs.engine_queue import ENGINE, UNTRACKED
from app.turn import Turn, trace_document, write_trace
from app.views.render import chat_write, error_html, error_message, info_html, legend_html, render_user
from app.views.stats import SERIES_COLORS, acceptance_frame, render_stats, speedup_frame
from engine.errors import EngineError

LIVE_CLASSES = ("chat-live",)
ASSETS = Path(__file__).resolve().parents[2] / "assets"
LIVE_JS = ASSETS / "live.js"  # the live box's script, read as the page is built
CHAT_JS = ASSETS / "chat.js"  # the finished messages' script: a write appends, nothing is drawn again
# the speedup plot's "theory" line is engine.costs.costmodel.StepCosts.speedup at each k (not a closed formula)
THEORY_CAPTION = ("theory: (1-α^(k+1))/(1-α) tokens per step over the step's k·t_draft + t_verify(k+1), "
                  "times t_verify(1): this answer's α and draft time, and the measured verify curve t_verify(n) "
                  "(a fitted line until two lengths are measured)")


@dataclass(frozen=True)
class ChatTab:
    chat: gr.HTML  # the finished messages: each write keeps the first n and appends the new (assets/chat.js)
    live: gr.HTML  # the answer while it streams, under the chat: a redraw never touches the earlier messages
    error_box: gr.HTML  # the race and the pair panel say their errors here too
    msg: gr.Textbox
    prediction: gr.Textbox  # an expected answer: text the answer should restate, verified as a free draft
    send: gr.Button
    stop: gr.Button
    regen: gr.Button
    clear: gr.Button
    export: gr.Button
    trace_file: gr.File
    history: gr.State  # raw messages for the engine: [{"role", "content"}], no HTML
    shown: gr.State  # the same messages as displayed: escaped HTML
    trace: gr.State  # the last answer's trace document
    pending: gr.State  # a finished answer on its way into the chat (join_answer writes it there); None between
    stats: gr.HTML  # the numbers and the break-even meter; a pair load resets it
    accept_plot: gr.BarPlot
    speed_plot: gr.LinePlot


def create(baseline: dict | None) -> ChatTab:
    """The tab: the conversation on the left, the statistics of its last answer on the right."""
    with gr.Tab("Chat", id="chat-tab"):
        with gr.Row(equal_height=False):
            with gr.Column(scale=3, min_width=420):
                chat = create_chat_panel(example_inputs(), example_labels())
            with gr.Column(scale=2, min_width=340):
                stats = create_stats_panel(render_stats(None, None, baseline))
    return ChatTab(**chat, **stats)


def answer_views(tab: ChatTab) -> list:
    """The chat's answers, finished and streaming, with their own classes, for the "show rejected" and "answer
    view" switches."""
    return [(tab.chat, []), (tab.live, list(LIVE_CLASSES))]


def create_chat_panel(examples: list[list[str]], labels: list[str]) -> dict:
    """The chat's components by ChatTab field (the stats panel adds the rest)."""
    gr.HTML(legend_html(), elem_id="legend")
    # the page keeps the messages (assets/chat.js); its text is already escaped HTML (app.views.render), so no
    # sanitiser runs on it, and a write's value holds only the new messages, never the conversation
    chat = gr.HTML(chat_write(0, [], "start"), elem_id="chat", js_on_load=CHAT_JS.read_text(encoding="utf-8"))
    live = gr.HTML(elem_id="chat-live", elem_classes=list(LIVE_CLASSES), js_on_load=LIVE_JS.read_text(encoding="utf-8"))
    error_box = gr.HTML(elem_id="error-box")
    with gr.Row(equal_height=True):
        # Gradio submits on Enter only when lines == 1 (with more lines it submits on Shift+Enter); max_lines > 1
        # lets Shift+Enter add lines and the box grow up to that many
        msg = gr.Textbox(placeholder="Message (Enter to send, Shift+Enter for a new line)", show_label=False,
                         lines=1, max_lines=8, scale=6, elem_id="msg", autofocus=True)
        send = gr.Button("Send", variant="primary", scale=1, elem_id="send", min_width=80)
        stop = gr.Button("Stop", variant="stop", scale=1, elem_id="stop", min_width=80)
    with gr.Accordion("Expected answer (a prediction the target verifies)", open=False, elem_id="prediction-box"):
        prediction = gr.Textbox(show_label=False, lines=3, max_lines=16, elem_id="prediction",
                                placeholder="Paste text the answer should restate, e.g. the file you ask to edit. Its "
                                            "tokens are drafted for free and the target checks each: the answer is "
                                            "the target's own either way (OpenAI's predicted outputs).")
    with gr.Row():
        regen = gr.Button("↻ Regenerate", size="sm", elem_id="regenerate")
        clear = gr.Button("Clear chat", size="sm", elem_id="clear")
        export = gr.Button("Export trace (JSON)", size="sm", elem_id="export")
    trace_file = gr.File(label="Speculation trace of the last answer", visible=False, elem_id="trace-file")
    gr.Examples(examples, inputs=[msg], label="Examples (code and edits accept many draft tokens; poems and "
                                             "random lists accept few)", example_labels=labels,
                examples_per_page=8)
    return dict(chat=chat, live=live, error_box=error_box, msg=msg, prediction=prediction, send=send, stop=stop,
                regen=regen, clear=clear, export=export, trace_file=trace_file, history=gr.State([]),
                shown=gr.State([]), trace=gr.State({}), pending=gr.State(None))


def create_stats_panel(stats_html: str) -> dict:
    stats = gr.HTML(stats_html, elem_id="stats")
    accept_plot = gr.BarPlot(x="position", y="acceptance", title="Acceptance by draft position",
                             y_lim=[0, 1], height=220, elem_id="accept-plot", x_title="draft position",
                             y_title="accepted / proposed")
    speed_plot = gr.LinePlot(x="k", y="speedup", color="series", color_map=SERIES_COLORS, height=250,
                             title="Speedup vs draft length k", caption=THEORY_CAPTION,
                             elem_id="speed-plot", x_title="draft length k", y_title="speedup ×")
    return dict(stats=stats, accept_plot=accept_plot, speed_plot=speed_plot)


def _fail(tab: ChatTab, err: EngineError) -> dict:
    message = error_message(err)
    toast.warn(message)
    return {tab.error_box: error_html(message)}


def _start(ctx: AppContext, messages: list[dict], s: UISettings, flag, prediction: str = ""):
    """Build configs and pull the first event, so bad input fails here, before the chat changes."""
    sampling, spec = sampling_config(s), spec_config(s)
    events = ctx.engine.generate(messages, sampling, spec, cache=cache_config(s), cancel=flag,
                                 prediction=prediction)
    first = next(events, None)
    return events, ([] if first is None else [first])


def stream_answer(ctx: AppContext, tab: ChatTab, *, history: list[dict], shown: list, prompt: str,
                  settings: UISettings, session: str, prediction: str = ""):
    """Generator of component updates: the answer to ``prompt`` streamed into the chat, stats and plots.

    Closing it (the Stop button's ``cancels=``, a closed tab) sets the engine's cancel flag: generation
    stops at its next step.
    """
    with ctx.cancels.running(session) as flag:
        yield from _stream_answer(ctx, tab, history=history, shown=shown, prompt=prompt, s=settings, flag=flag,
                                  prediction=prediction)


def _stream_answer(ctx: AppContext, tab: ChatTab, *, history: list[dict], shown: list, prompt: str,
                   s: UISettings, flag, prediction: str = ""):
    messages = [*history, {"role": "user", "content": prompt}]
    # the pair read once, as the answer starts (as the engine reads its own): the meter and the trace speak of it
    pair = ctx.pair()
    try:
        events, head = _start(ctx, messages, s, flag, prediction)
    except EngineError as err:  # bad input: said in the error box, the chat stays as it was
        yield _fail(tab, err)
        return
    turn, frames, panel = Turn(), Frames(), Frames(PANEL_S)
    baseline, doc = ctx.speed(pair), trace_document(turn, messages, pair, s.to_dict())
    # the question and the answer stream into the live box under the chat, and join the chat once the answer is done
    # (join_answer, the event after this one): the chat, its states and the plots are no outputs of the streaming
    # event. Gradio writes the live box at the start (the question, an empty answer and the URL of its own stream)
    # and at the end; the frames between go over that stream (app/api/live_stream.py), so what a frame costs is
    # this answer's new tokens, with none of Gradio's per-message work in the server or the page
    question, live = render_user(prompt), ctx.live.open()
    try:
        yield {tab.msg: "", tab.error_box: error_html(None), tab.live: live_start(question, live.url)}
        drawn = LiveDraw(live)
        with contextlib.closing(events):
            for event in chain(head, events):
                turn.add(event)
                if live.abandoned:  # the page reading this answer went away (a closed tab): stop at the next step
                    flag.set()
                finished = event.type == "done"
                if not (finished or frames.due(event.type)):
                    continue
                # the panel rides on a frame at its own, slower pace (its figures settle over steps, not tokens); the
                # last frame holds both, so the page shows the answer's end as it comes, not once Gradio's last
                # message (the whole answer, rendered again) has crossed its queue and been drawn
                figures = render_stats(turn.stats, turn.cache, baseline, _status(turn)) \
                    if finished or panel.due(event.type) else None
                drawn.frame(turn, figures if live.claimed else None)
                if figures is not None and not (finished or live.claimed):
                    # nobody reads the stream (a script on Gradio's API `/send`): the panel goes through Gradio, and
                    # the yield is where Gradio can close this handler when that client cancels
                    yield {tab.stats: figures}
        if turn.done is None:
            return
        answer = turn.html()  # the whole answer, and what the join writes into the chat and the states
        yield {tab.stats: render_stats(turn.stats, turn.cache, baseline, _status(turn)),
               tab.live: live_box(question, answer),
               tab.pending: {"shown": [*shown, {"role": "user", "content": question},
                                       {"role": "assistant", "content": answer, "text": turn.text}],
                             "history": [*messages, {"role": "assistant", "content": turn.text}],
                             "trace": doc, "stats": turn.stats, "baseline": baseline}}
    finally:
        ctx.live.end(live)


def join_answer(tab: ChatTab, pending: dict | None) -> dict:
    """The finished answer joins the chat in one update: the chat and its states take it, the live box empties, and
    the plots draw once (a plot redraw costs the browser most). Nothing when no answer finished (an error, a
    cancelled stream, Clear): only the empty slot is written again (Gradio refuses an empty dict as a partial update)."""
    if not pending:
        return {tab.pending: None}
    shown = pending["shown"]
    write = chat_write(len(shown) - 2, shown[-2:], uuid.uuid4().hex)
    return {tab.chat: write, tab.live: "", tab.shown: pending["shown"], tab.history: pending["history"],
            tab.trace: pending["trace"], tab.accept_plot: acceptance_frame(pending["stats"]),
            tab.speed_plot: speedup_frame(pending["stats"], pending["baseline"]), tab.pending: None}


def _status(turn: Turn) -> str:
    if turn.done is None:
        return "streaming…" if turn.cache is None else f"streaming… (cache: {turn.cache.outcome})"
    counts = ", ".join(f"{n} {kind}" for kind, n in turn.kind_counts().items())
    head = "stopped by you" if turn.done.finish_reason == "cancelled" else f"done ({turn.done.finish_reason})"
    return f"{head}: {len(turn.done.token_ids)} tokens in {turn.done.stats.elapsed_s:.1f} s — {counts}"


def make_handlers(ctx: AppContext, tab: ChatTab, controls: Controls) -> dict:
    """Closures over the context and the components, ready for event listeners."""

    def send(data: dict, request: gr.Request):
        s = controls.read(data)
        yield from stream_answer(ctx, tab, history=data[tab.history] or [], shown=data[tab.shown] or [],
                                 prompt=data[tab.msg] or "", settings=s, session=session_id(request),
                                 prediction=data[tab.prediction] or "")

    def regenerate(data: dict, request: gr.Request):
        history, shown = data[tab.history] or [], data[tab.shown] or []
        if len(history) < 2 or history[-1]["role"] != "assistant":
            toast.warn("nothing to regenerate yet: send a message first")
            yield {tab.error_box: error_html("nothing to regenerate yet: send a message first")}
            return
        prompt = history[-2]["content"]
        fresh = replace(controls.read(data), cache_enabled=False)  # a new answer, not the cached one
        yield from stream_answer(ctx, tab, history=history[:-2], shown=shown[:-2], prompt=prompt, settings=fresh,
                                 session=session_id(request), prediction=data[tab.prediction] or "")

    def stop(request: gr.Request):
        """Only raise the cancel flag: the engine ends at its next step with finish reason "cancelled", and the
        answer's own stream writes the last update ("stopped by you"), so no late update can undo it."""
        if ctx.cancels.cancel(session_id(request)):
            return info_html("Stopping at the next step…")
        return info_html("Nothing is running.")

    def clear(request: gr.Request):
        ctx.cancels.cancel(session_id(request))
        empty_stats = render_stats(None, None, ctx.speed(ctx.pair()))
        return (chat_write(0, [], uuid.uuid4().hex), "", [], [], {}, error_html(None), empty_stats,
                acceptance_frame(None), speedup_frame(None, None),
                gr.update(value=None, visible=False), None)

    def join(pending: dict | None):
        return join_answer(tab, pending)

    def export(trace: dict):
        return export_trace_file(trace, prefix="speclens-trace-", nothing="no answer to export yet")

    return dict(send=send, regenerate=regenerate, stop=stop, clear=clear, export=export, join=join)


def export_trace_file(trace: dict, *, prefix: str, nothing: str):
    """The download button's update: the trace as a JSON file, or a warning when there is nothing yet."""
    if not trace or not trace.get("events"):
        toast.warn(nothing)
        return gr.update(value=None, visible=False)
    path = tempfile.NamedTemporaryFile(prefix=prefix, suffix=".json", delete=False).name
    return gr.update(value=write_trace(trace, path), visible=True)


def wire(ctx: AppContext, tab: ChatTab, controls: Controls) -> list:
    """The chat's events; returns the two that end an answer (each answer's join into the chat, after send and
    regenerate), for what should follow an answer."""
    h = make_handlers(ctx, tab, controls)
    inputs = {*controls.settings_fields().values(), tab.msg, tab.prediction, tab.history, tab.shown}
    outputs = [tab.live, tab.stats, tab.msg, tab.error_box, tab.pending]  # what a frame may touch: nothing more
    joined = [tab.chat, tab.live, tab.shown, tab.history, tab.trace, tab.accept_plot, tab.speed_plot, tab.pending]
    # no progress overlay: the live box and the panel's status show the answer's progress, and an overlay's timer
    # would repaint the whole chat several times a second on the cores the model runs on; the live box alone shows
    # the minimal status (a queued answer's place in the queue)
    progress = dict(show_progress="minimal", show_progress_on=[tab.live])
    send = gr.on([tab.msg.submit, tab.send.click], h["send"], inputs, outputs, api_name="send", **progress, **ENGINE)
    regen = tab.regen.click(h["regenerate"], inputs, outputs, api_name="regenerate", **progress, **ENGINE)
    # joining runs no model, so it is not queued: over the queue, a message sent as the answer joins the chat could
    # race Gradio's client closing its event stream and never be read (docs/app.md, "Events after an answer")
    answered = [answer.then(h["join"], [tab.pending], joined, queue=False, api_visibility="private", **UNTRACKED)
                for answer in (send, regen)]
    tab.stop.click(h["stop"], None, [tab.error_box], queue=False, api_visibility="private")
    tab.clear.click(h["clear"], None, [tab.chat, tab.live, tab.shown, tab.history, tab.trace, tab.error_box,
                                       tab.stats, tab.accept_plot, tab.speed_plot, tab.trace_file, tab.pending],
                    cancels=[send, regen], queue=False, api_name="clear", **UNTRACKED)
    tab.export.click(h["export"], [tab.trace], [tab.trace_file], api_name="export_trace")
    return answered
