"""Race mode: the same prompt target-only, then speculative; both answers, timings, speedup, identical-check."""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import gradio as gr

from app import toast
from app.context import AppContext, session_id
from app.live import Frames
from app.tabs.chat import export_trace_file
from app.tabs.controls import Controls
from app.tabs.engine_queue import ENGINE
from app.views.divergence import divergence_html, proof_html
from app.views.render import error_html, error_message, esc
from app.settings import UISettings, sampling_config, spec_config
from app.turn import Turn, trace_document
from engine.config import CACHE_OFF
from engine.errors import EngineError
from engine.surface import PairInfo

ANSWER_CLASSES = ("race-answer",)


@dataclass(frozen=True)
class RaceTab:
    prompt: gr.Textbox
    run: gr.Button
    stop: gr.Button
    summary: gr.HTML
    target: gr.HTML  # the target-only answer
    spec: gr.HTML  # the speculative answer
    prove: gr.Button
    proof: gr.HTML
    export: gr.Button
    trace: gr.State  # the last race: its prompt, settings, both answers' events and the divergence
    trace_file: gr.File
    error_box: gr.HTML  # the chat tab's: bad input is said there too


def create(error_box: gr.HTML) -> RaceTab:
    with gr.Tab("Race", id="race-tab"):
        gr.Markdown("Runs the prompt with the **target alone**, then with **speculative decoding** (cache off), "
                    "using the decoding settings on the left. Under greedy decoding both must give the same tokens.")
        with gr.Row(equal_height=True):
            prompt = gr.Textbox(label="Race prompt (Enter to race, Shift+Enter for a new line)", lines=1,
                                max_lines=6, scale=6, elem_id="race-prompt",
                                value="Write a Python function that checks whether a string is a palindrome.")
            run = gr.Button("Race", variant="primary", scale=1, elem_id="race-run")
            stop = gr.Button("Stop", variant="stop", scale=1, elem_id="race-stop")
        summary = gr.HTML(elem_id="race-summary")
        with gr.Row():
            prove = gr.Button("Prove it: both decodes again in fp32", visible=False, elem_id="race-prove", size="sm")
            export = gr.Button("Export race trace (JSON)", size="sm", elem_id="race-export")
        proof = gr.HTML(elem_id="race-proof")
        trace_file = gr.File(label="Race trace", visible=False, elem_id="race-trace-file")
        trace = gr.State({})
        with gr.Row():
            with gr.Column():
                gr.Markdown("#### Target only")
                target = gr.HTML(elem_id="race-target", elem_classes=list(ANSWER_CLASSES))
            with gr.Column():
                gr.Markdown("#### Speculative")
                spec = gr.HTML(elem_id="race-spec", elem_classes=list(ANSWER_CLASSES))
    return RaceTab(prompt=prompt, run=run, stop=stop, summary=summary, target=target, spec=spec, prove=prove,
                   proof=proof, export=export, trace=trace, trace_file=trace_file, error_box=error_box)


def answer_views(tab: RaceTab) -> list:
    """The two answers with their own classes, for the "show rejected" and "answer view" switches."""
    return [(tab.target, list(ANSWER_CLASSES)), (tab.spec, list(ANSWER_CLASSES))]


def _side(turn: Turn, streaming: bool) -> str:
    head = ""
    if turn.stats is not None:
        head = (f'<div class="race-head">{turn.stats.new_tokens} tokens · {turn.stats.elapsed_s:.2f} s · '
                f"{turn.stats.tokens_per_s:.1f} tok/s</div>")
    return head + turn.html(streaming=streaming)


def _pump(events, turn: Turn, out):
    """Stream one side of the race into its panel, at the chat's frame budget (app/tabs/chat.py's Frames): the
    decode runs ahead on its worker, so a redraw never slows the side it times."""
    frames = Frames()
    with contextlib.closing(events):
        for event in events:
            turn.add(event)
            if event.type == "done" or frames.due(event.type):
                yield {out: _side(turn, streaming=event.type != "done")}


def race_summary(ref: Turn, spec: Turn, greedy: bool, divergence=None, bit_identical: bool = False,
                 identity_note: str = "") -> str:
    """Speeds, speedup and the identity check; a divergence (engine.divergence.Divergence) is explained.
    ``bit_identical``: the load-time check found every verify row equal to the token fed alone on this machine
    (``identity_note`` says so in words), so greedy identity is a measured fact, not a matter of ties."""
    if ref.done is None or spec.done is None or "cancelled" in (ref.finish_reason, spec.finish_reason):
        return '<div class="race-summary">Race stopped before both runs finished.</div>'
    r, p = ref.done.stats, spec.done.stats
    factor = p.tokens_per_s / r.tokens_per_s if r.tokens_per_s > 0 else 0.0
    if not greedy:
        check = ('<span class="race-na">sampling (temperature &gt; 0): the answers are draws from the same '
                 "distribution, not expected to be identical</span>")
    elif ref.done.token_ids == spec.done.token_ids and bit_identical:
        check = (f'<span class="race-ok">✓ bit-identical ({len(ref.done.token_ids)} tokens): the target computes '
                 f"each token the same alone or inside a verify ({esc(identity_note or 'measured at load')})</span>")
    elif ref.done.token_ids == spec.done.token_ids:
        check = (f'<span class="race-ok">✓ identical token ids ({len(ref.done.token_ids)} tokens; this pair is '
                 f"{esc(identity_note or 'identical up to rounding ties')})</span>")
    else:
        first = next((i for i, (a, b) in enumerate(zip(ref.done.token_ids, spec.done.token_ids)) if a != b),
                     min(len(ref.done.token_ids), len(spec.done.token_ids)))
        claim = " although the load-time check found every verify row equal" if bit_identical else ""
        check = f'<span class="race-bad">✗ token ids differ from position {first}{esc(claim)}</span>'
    verdict = "faster" if factor >= 1 else "slower"
    return (f'<div class="race-summary"><b>Speculative is {factor:.2f}× the target-only speed ({verdict})</b> · '
            f"target only {r.elapsed_s:.2f} s ({r.tokens_per_s:.1f} tok/s) · speculative {p.elapsed_s:.2f} s "
            f"({p.tokens_per_s:.1f} tok/s, acceptance {p.acceptance.acceptance_rate:.0%}) · {check}"
            f"{divergence_html(divergence)}</div>")


def _start_reference(ctx: AppContext, messages: list[dict], s: UISettings, flag):
    """Validate the settings for both runs and pull the first target-only event, so bad input fails here."""
    sampling, spec_cfg = sampling_config(s), spec_config(s)
    ref_events = ctx.engine.generate_reference(messages, sampling, cancel=flag)
    return sampling, spec_cfg, ref_events, next(ref_events)


def _explain(ctx: AppContext, messages: list[dict], sampling, ref: Turn, spec: Turn):
    """The engine's account of the first differing token, when a finished greedy race differs."""
    if not sampling.greedy or ref.done is None or spec.done is None or ref.done.token_ids == spec.done.token_ids:
        return None
    if "cancelled" in (ref.finish_reason, spec.finish_reason):
        return None
    return ctx.engine.explain_divergence(messages, list(ref.done.token_ids), list(spec.done.token_ids))


def race_trace(ref: Turn, spec: Turn, messages: list[dict], pair: PairInfo | None, s: UISettings,
               divergence) -> dict:
    """The speculative answer's trace, with the target-only events and the divergence explained."""
    return trace_document(spec, messages, pair, s.to_dict(), divergence=divergence, reference=ref)


def claims_identity(pair, spec_cfg) -> bool:
    """Whether the load-time check makes this race's greedy answers bit-identical: every verify row was equal, or
    the pair is in ``identical`` mode (engine/serve/verify_mode.py) and the race's k is adaptive, so it keeps to
    the widths found identical."""
    if pair is None:
        return False
    return pair.bit_identical or (pair.verify_mode == "identical" and spec_cfg.adaptive)


def run_race(ctx: AppContext, tab: RaceTab, prompt: str, s: UISettings, session: str):
    """Both runs, streamed; closing this generator (Stop, a closed tab) stops the engine at its next step."""
    with ctx.cancels.running(session) as flag:
        yield from _race(ctx, tab, prompt, s, flag)


def _race(ctx: AppContext, tab: RaceTab, prompt: str, s: UISettings, flag):
    messages = [{"role": "user", "content": prompt}]
    pair = ctx.pair()  # read once, as the race starts: its identity claim and trace are of the pair that ran
    try:
        sampling, spec_cfg, ref_events, first = _start_reference(ctx, messages, s, flag)
    except EngineError as err:  # bad input: said in the error box and the summary
        message = error_message(err)
        toast.warn(message)
        yield {tab.error_box: error_html(message), tab.summary: error_html(message)}
        return
    ref, spec = Turn(), Turn()
    ref.add(first)
    yield {tab.summary: '<div class="race-summary">Running the target alone…</div>',
           tab.target: "", tab.spec: "", tab.error_box: error_html(None),
           tab.proof: "", tab.prove: gr.update(visible=False)}
    yield from _pump(ref_events, ref, tab.target)
    if not flag.is_set():
        yield {tab.summary: '<div class="race-summary">Running speculative decoding…</div>'}
        spec_events = ctx.engine.generate(messages, sampling, spec_cfg, cache=CACHE_OFF, cancel=flag)
        yield from _pump(spec_events, spec, tab.spec)
    divergence = _explain(ctx, messages, sampling, ref, spec)
    yield {tab.summary: race_summary(ref, spec, sampling.greedy, divergence, claims_identity(pair, spec_cfg),
                                     pair.identity_note if pair else ""),
           # any divergence can be re-run in fp32: a tie settles there; one where the check found no ties is a bug
           tab.prove: gr.update(visible=divergence is not None),
           tab.trace: race_trace(ref, spec, messages, pair, s, divergence)}


def prove_race(ctx: AppContext, tab: RaceTab, trace: dict):
    """Re-run the last race's prompt with fp32 copies of the pair and say whether the answers now agree."""
    if not trace or not trace.get("messages"):
        return {tab.proof: error_html("run a race first")}
    s = UISettings(**trace["settings"])
    try:
        proof = ctx.engine.prove_fp32(trace["messages"], sampling_config(s), spec_config(s))
    except (EngineError, OSError) as err:  # bad input, or the fp32 copies could not be read or written
        return {tab.proof: error_html(error_message(err))}
    return {tab.proof: proof_html(proof), tab.trace: {**trace, "fp32_proof": proof.to_dict()}}


def make_race_handlers(ctx: AppContext, tab: RaceTab, controls: Controls) -> dict:
    def race(data: dict, request: gr.Request):
        yield from run_race(ctx, tab, data[tab.prompt] or "", controls.read(data), session_id(request))

    def stop(request: gr.Request):
        ctx.cancels.cancel(session_id(request))

    def prove(trace: dict):
        return prove_race(ctx, tab, trace)

    def export(trace: dict):
        return export_trace_file(trace, prefix="speclens-race-", nothing="no race to export yet")

    return dict(race=race, stop=stop, prove=prove, export=export)


def wire(ctx: AppContext, tab: RaceTab, controls: Controls) -> None:
    h = make_race_handlers(ctx, tab, controls)
    inputs = {*controls.settings_fields().values(), tab.prompt}
    outputs = [tab.summary, tab.target, tab.spec, tab.error_box, tab.prove, tab.proof, tab.trace]
    # progress on the summary: the two answers stream in their own views, which stay out of the page's loading statuses
    # (app/tabs/engine_queue.py)
    race = gr.on([tab.prompt.submit, tab.run.click], h["race"], inputs, outputs, api_name="race",
                 show_progress_on=[tab.summary], **ENGINE)
    tab.stop.click(h["stop"], None, None, cancels=[race], queue=False, api_visibility="private")
    tab.prove.click(h["prove"], [tab.trace], [tab.proof, tab.trace], api_name="race_prove_fp32",
                    show_progress_on=[tab.proof], **ENGINE)
    tab.export.click(h["export"], [tab.trace], [tab.trace_file], api_visibility="private")
