"""The Experiments tab: a grid over prompt sets, k, temperature, proposer, draft and precisions, run through
``engine.run_experiment`` with progress and Stop; the pair doctor; downloads (CSV, JSON, HTML report); a saved
run reloaded. The engine does the work (engine/lab); this module reads the form and renders."""
from __future__ import annotations

import tempfile

import gradio as gr

from app.context import AppContext, session_id
from engine.lab.report.files import load_result, save_result
from engine.lab.report.views import acceptance_chart, doctor_html, progress_html, speedup_chart, table_frame
from app.views.render import error_html, error_message
from engine.config import PRECISIONS
from engine.errors import EngineError, InvalidSettingError
from engine.lab.grid import (LAB_PROPOSERS, OWN, PROMPT_SETS, ExperimentGrid, own_prompts, parse_ks, parse_names,
                             parse_temperatures)

FORM = ("exp_sets", "exp_prompts", "exp_ks", "exp_temps", "exp_proposers", "exp_target", "exp_drafts",
        "exp_draft_precs", "exp_target_precs", "exp_per_set", "exp_tokens", "exp_seed")
DOWNLOADS = ("exp_csv", "exp_json", "exp_html")


def create_experiments_tab(pair: dict | None) -> dict:
    pair = pair or {}
    gr.Markdown("Run a **grid** of speculative settings over prompt sets: each cell runs its prompts "
                "speculatively and target-only, seeded (prompt *i* samples with seed + *i*), so a rerun gives the "
                "same tokens. Models load once per run; chats in other tabs wait until the run ends or stops.")
    e = {}
    with gr.Row():
        e["exp_sets"] = gr.CheckboxGroup(list(PROMPT_SETS), value=["code"], label="Prompt sets", elem_id="exp-sets")
        e["exp_prompts"] = gr.Textbox(label="Own prompts (one per line; the set 'own')", lines=2, elem_id="exp-prompts")
    with gr.Row():
        e["exp_ks"] = gr.Textbox("2, 4, 8", label="k values (and/or 'adaptive')", elem_id="exp-ks")
        e["exp_temps"] = gr.Textbox("0", label="Temperatures", elem_id="exp-temps")
        e["exp_proposers"] = gr.CheckboxGroup(list(LAB_PROPOSERS), value=["draft"], label="Proposers",
                                              elem_id="exp-proposers")
    with gr.Row():
        e["exp_target"] = gr.Textbox(pair.get("target", ""), label="Target model", elem_id="exp-target")
        e["exp_drafts"] = gr.Textbox(pair.get("draft", ""), label="Draft models (comma-separated)",
                                     elem_id="exp-drafts")
    with gr.Row():
        e["exp_draft_precs"] = gr.CheckboxGroup(list(PRECISIONS), value=[pair.get("draft_precision", "auto")],
                                                label="Draft precisions", elem_id="exp-draft-precs")
        e["exp_target_precs"] = gr.CheckboxGroup(list(PRECISIONS), value=[pair.get("target_precision", "auto")],
                                                 label="Target precisions", elem_id="exp-target-precs")
    with gr.Row():
        e["exp_per_set"] = gr.Number(2, precision=0, label="Prompts per set", elem_id="exp-per-set")
        e["exp_tokens"] = gr.Number(48, precision=0, label="New tokens per prompt", elem_id="exp-tokens")
        e["exp_seed"] = gr.Number(0, precision=0, label="Seed", elem_id="exp-seed")
    with gr.Row():
        e["exp_doctor"] = gr.Button("Check the loaded pair (pair doctor)", elem_id="exp-doctor")
        e["exp_run"] = gr.Button("Run grid", variant="primary", elem_id="exp-run")
        e["exp_stop"] = gr.Button("Stop", variant="stop", elem_id="exp-stop")
    e["exp_progress"] = gr.HTML(elem_id="exp-progress")
    e["exp_table"] = gr.Dataframe(label="Results (one row per cell)", interactive=False, wrap=True,
                                  elem_id="exp-table")
    with gr.Row():
        e["exp_speedup"] = gr.HTML(speedup_chart([]), elem_id="exp-speedup")
        e["exp_accept"] = gr.HTML(acceptance_chart([]), elem_id="exp-accept")
    e["exp_doctor_out"] = gr.HTML(elem_id="exp-doctor-out")
    with gr.Row():
        e["exp_csv"] = gr.DownloadButton("Download CSV", visible=False, elem_id="exp-csv")
        e["exp_json"] = gr.DownloadButton("Download JSON", visible=False, elem_id="exp-json")
        e["exp_html"] = gr.DownloadButton("Download HTML report", visible=False, elem_id="exp-html")
    e["exp_load"] = gr.File(label="Load a saved experiment (JSON): shows it and fills the form to rerun it",
                            file_types=[".json"], elem_id="exp-load")
    e["exp_result"] = gr.State({})
    e["exp_doctor_state"] = gr.State({})
    return e


def read_grid(e: dict, data: dict) -> ExperimentGrid:
    """The form as a grid; bad input raises InvalidSettingError with the sentence to show."""
    prompts = own_prompts(data[e["exp_prompts"]])
    sets = tuple(data[e["exp_sets"]] or ()) + ((OWN,) if prompts else ())

    def whole(name: str, label: str) -> int:
        value = data[e[name]]
        if value is None or not float(value).is_integer():
            raise InvalidSettingError(f"{label} must be a whole number, got {value!r}")
        return int(value)

    return ExperimentGrid(sets=sets, prompts=prompts, ks=parse_ks(data[e["exp_ks"]]),
                          temperatures=parse_temperatures(data[e["exp_temps"]]),
                          proposers=tuple(data[e["exp_proposers"]] or ()),
                          drafts=parse_names(data[e["exp_drafts"]], "draft models"),
                          draft_precisions=tuple(data[e["exp_draft_precs"]] or ()),
                          target_precisions=tuple(data[e["exp_target_precs"]] or ()),
                          target=(data[e["exp_target"]] or "").strip(), prompts_per_set=whole("exp_per_set",
                                                                                             "prompts per set"),
                          max_new_tokens=whole("exp_tokens", "new tokens"), seed=whole("exp_seed", "seed"))


def form_values(grid: dict) -> list:
    """A saved grid back into the form (in FORM's order)."""
    sets = [s for s in grid["sets"] if s != OWN]
    return [sets, "\n".join(grid["prompts"]), ", ".join(map(str, grid["ks"])),
            ", ".join(f"{t:g}" for t in grid["temperatures"]), list(grid["proposers"]), grid["target"],
            ", ".join(grid["drafts"]), list(grid["draft_precisions"]), list(grid["target_precisions"]),
            grid["prompts_per_set"], grid["max_new_tokens"], grid["seed"]]


def _views(e: dict, rows: list[dict]) -> dict:
    return {e["exp_table"]: table_frame(rows), e["exp_speedup"]: speedup_chart(rows),
            e["exp_accept"]: acceptance_chart(rows)}


def _downloads(e: dict, paths: dict | None) -> dict:
    if paths is None:
        return {e[name]: gr.update(value=None, visible=False) for name in DOWNLOADS}
    return {e["exp_csv"]: gr.update(value=str(paths["csv"]), visible=True),
            e["exp_json"]: gr.update(value=str(paths["json"]), visible=True),
            e["exp_html"]: gr.update(value=str(paths["html"]), visible=True)}


def run_experiment(ctx: AppContext, e: dict, data: dict, session: str):
    try:
        grid = read_grid(e, data)
    except EngineError as err:
        yield {e["exp_progress"]: error_html(error_message(err))}
        return
    rows, result = [], None
    yield {e["exp_progress"]: progress_html(0, 1, "Starting…"), **_views(e, rows), **_downloads(e, None)}
    with ctx.cancels.running(session) as flag:
        try:
            for update in ctx.engine.run_experiment(grid, flag):
                out = {e["exp_progress"]: progress_html(update.done, update.total, update.message, update.loading)}
                if update.row is not None:
                    rows.append(update.row)
                    out.update(_views(e, rows))
                result = update.result or result
                yield out
        except EngineError as err:  # e.g. a model that does not exist, or a pair that cannot pair
            yield {e["exp_progress"]: error_html(error_message(err))}
            return
    doctor = data[e["exp_doctor_state"]]
    if doctor and doctor.get("target") == grid.target:
        result["doctor"] = doctor
    paths = save_result(result, tempfile.mkdtemp(prefix="speclens-experiment-"))
    yield {e["exp_result"]: result, **_views(e, rows), **_downloads(e, paths),
           e["exp_doctor_out"]: doctor_html(result.get("doctor"), rows),
           e["exp_progress"]: progress_html(len(rows), len(grid.cells()), f"{result_message(result)} · saved "
                                            f"{paths['json'].name} and the report")}


def result_message(result: dict) -> str:
    n = len(result["rows"])
    return f"Stopped after {n} cells" if result.get("stopped") else f"Finished {n} cells"


def run_doctor(ctx: AppContext, e: dict, data: dict, session: str):
    kinds = tuple(data[e["exp_sets"]] or ()) or ("code",)
    yield {e["exp_doctor_out"]: progress_html(0, 1, "Pair doctor: measuring the loaded pair and probing "
                                                    f"{', '.join(kinds)}…", loading=True)}
    with ctx.cancels.running(session) as flag:
        try:
            report = ctx.engine.pair_doctor(kinds, 24, flag).to_dict()
        except EngineError as err:
            yield {e["exp_doctor_out"]: error_html(error_message(err))}
            return
    rows = (data[e["exp_result"]] or {}).get("rows", [])
    yield {e["exp_doctor_out"]: doctor_html(report, rows), e["exp_doctor_state"]: report}


def show_saved(e: dict, path: str | None) -> dict:
    """A saved JSON: its table, plots and doctor, the downloads again, and its grid in the form."""
    if not path:
        return {}
    try:
        result = load_result(path)
    except EngineError as err:
        return {e["exp_progress"]: error_html(error_message(err))}
    paths = save_result(result, tempfile.mkdtemp(prefix="speclens-experiment-"))
    rows = result["rows"]
    return {**_views(e, rows), **_downloads(e, paths), e["exp_result"]: result,
            e["exp_doctor_out"]: doctor_html(result.get("doctor"), rows),
            **dict(zip([e[n] for n in FORM], form_values(result["grid"]))),
            e["exp_progress"]: progress_html(len(rows), len(rows), f"Loaded a run from {result['created']}: "
                                                                   "press Run grid to run it again")}


def make_experiment_handlers(ctx: AppContext, e: dict) -> dict:
    def run(data: dict, request: gr.Request):
        yield from run_experiment(ctx, e, data, session_id(request))

    def doctor(data: dict, request: gr.Request):
        yield from run_doctor(ctx, e, data, session_id(request))

    def stop(request: gr.Request):
        ctx.cancels.cancel(session_id(request))

    def load(path):
        return show_saved(e, path)

    return dict(run=run, doctor=doctor, stop=stop, load=load)
