"""The Experiments tab: a grid over prompt sets, k, temperature, proposer, draft and precisions, estimated first
(a long one runs on a second press) and run through ``engine.run_experiment`` with progress and Stop; the pair doctor; downloads (CSV, JSON, HTML report); a saved
run reloaded. The engine does the work (engine/lab); this module reads the form and renders."""
from __future__ import annotations

import tempfile
from dataclasses import dataclass

import gradio as gr

from app.context import AppContext, session_id
from app.tabs.engine_queue import ENGINE, UNTRACKED
from app.views.render import error_html, error_message, info_html
from app.views.report.files import load_result, save_result
from app.views.report.views import acceptance_chart, doctor_html, progress_html, speedup_chart, table_frame
from engine.config import AUTO, PRECISIONS
from engine.errors import EngineError, InvalidSettingError
from engine.surface import (LAB_PROPOSERS, OWN, PROMPT_SETS, ExperimentGrid, own_prompts, parse_ks, parse_names,
                            parse_temperatures, PairInfo)

FORM = ("sets", "prompts", "ks", "temps", "proposers", "target", "drafts", "draft_precs", "target_precs", "per_set",
        "tokens", "seed")  # the grid's fields, in form_values' order
DOWNLOADS = ("download_csv", "download_json", "download_html")
RUN, RUN_ANYWAY = "Run grid", "Run anyway"
CONFIRM_ABOVE_S = 180  # a longer grid (or one whose time is unknown) starts on a second press, after its estimate


@dataclass(frozen=True)
class ExperimentsTab:
    sets: gr.CheckboxGroup
    prompts: gr.Textbox
    ks: gr.Textbox
    temps: gr.Textbox
    proposers: gr.CheckboxGroup
    target: gr.Textbox
    drafts: gr.Textbox
    draft_precs: gr.CheckboxGroup
    target_precs: gr.CheckboxGroup
    per_set: gr.Number
    tokens: gr.Number
    seed: gr.Number
    doctor: gr.Button
    run: gr.Button
    stop: gr.Button
    progress: gr.HTML
    table: gr.Dataframe
    speedup: gr.HTML
    accept: gr.HTML
    doctor_out: gr.HTML
    download_csv: gr.DownloadButton
    download_json: gr.DownloadButton
    download_html: gr.DownloadButton
    load: gr.File
    result: gr.State  # the last run (or the loaded one), as saved
    doctor_state: gr.State  # the last pair doctor report, saved with the next run of the same target
    confirming: gr.State  # the grid whose estimate asks "Run anyway": pressed again unchanged, it runs

    def form(self) -> list:
        """The grid's fields, in FORM's order."""
        return [getattr(self, name) for name in FORM]

    def views(self) -> list:
        return [self.progress, self.table, self.speedup, self.accept, self.doctor_out, self.download_csv,
                self.download_json, self.download_html, self.result]


def create(pair: PairInfo | None) -> ExperimentsTab:
    with gr.Tab("Experiments", id="experiments-tab"):
        gr.Markdown("Run a **grid** of speculative settings over prompt sets: each cell runs its prompts "
                    "speculatively and target-only, seeded (prompt *i* samples with seed + *i*), so a rerun gives "
                    "the same tokens. Models load once per run; chats in other tabs wait until the run ends or stops.")
        form = _create_form(pair)
        with gr.Row():
            buttons = dict(doctor=gr.Button("Check the loaded pair (pair doctor)", elem_id="exp-doctor"),
                           run=gr.Button(RUN, variant="primary", elem_id="exp-run"),
                           stop=gr.Button("Stop", variant="stop", elem_id="exp-stop"))
        return ExperimentsTab(**form, **buttons, **_create_results())


def _create_form(pair: PairInfo | None) -> dict:
    e = {}
    with gr.Row():
        e["sets"] = gr.CheckboxGroup(list(PROMPT_SETS), value=["code"], label="Prompt sets", elem_id="exp-sets")
        e["prompts"] = gr.Textbox(label="Own prompts (one per line; the set 'own')", lines=2, elem_id="exp-prompts")
    with gr.Row():
        e["ks"] = gr.Textbox("2, 4, 8", label="k values (and/or 'adaptive')", elem_id="exp-ks")
        e["temps"] = gr.Textbox("0", label="Temperatures", elem_id="exp-temps")
        e["proposers"] = gr.CheckboxGroup(list(LAB_PROPOSERS), value=["draft"], label="Proposers",
                                          elem_id="exp-proposers")
    with gr.Row():
        e["target"] = gr.Textbox(pair.target if pair else "", label="Target model", elem_id="exp-target")
        e["drafts"] = gr.Textbox(pair.draft if pair else "", label="Draft models (comma-separated)",
                                 elem_id="exp-drafts")
    with gr.Row():
        e["draft_precs"] = gr.CheckboxGroup(list(PRECISIONS), value=[pair.draft_precision if pair else AUTO],
                                            label="Draft precisions", elem_id="exp-draft-precs")
        e["target_precs"] = gr.CheckboxGroup(list(PRECISIONS), value=[pair.target_precision if pair else AUTO],
                                             label="Target precisions", elem_id="exp-target-precs")
    with gr.Row():
        e["per_set"] = gr.Number(2, precision=0, label="Prompts per set", elem_id="exp-per-set")
        e["tokens"] = gr.Number(48, precision=0, label="New tokens per prompt", elem_id="exp-tokens")
        e["seed"] = gr.Number(0, precision=0, label="Seed", elem_id="exp-seed")
    return e


def _create_results() -> dict:
    e = {"progress": gr.HTML(elem_id="exp-progress"),
         "table": gr.Dataframe(label="Results (one row per cell)", interactive=False, wrap=True, elem_id="exp-table")}
    with gr.Row():
        e["speedup"] = gr.HTML(speedup_chart([]), elem_id="exp-speedup")
        e["accept"] = gr.HTML(acceptance_chart([]), elem_id="exp-accept")
    e["doctor_out"] = gr.HTML(elem_id="exp-doctor-out")
    with gr.Row():
        e["download_csv"] = gr.DownloadButton("Download CSV", visible=False, elem_id="exp-csv")
        e["download_json"] = gr.DownloadButton("Download JSON", visible=False, elem_id="exp-json")
        e["download_html"] = gr.DownloadButton("Download HTML report", visible=False, elem_id="exp-html")
    e["load"] = gr.File(label="Load a saved experiment (JSON): shows it and fills the form to rerun it",
                        file_types=[".json"], elem_id="exp-load")
    e["result"], e["doctor_state"], e["confirming"] = gr.State({}), gr.State({}), gr.State(None)
    return e


def read_grid(tab: ExperimentsTab, data: dict) -> ExperimentGrid:
    """The form as a grid; bad input raises InvalidSettingError with the sentence to show."""
    prompts = own_prompts(data[tab.prompts])
    sets = tuple(data[tab.sets] or ()) + ((OWN,) if prompts else ())

    def whole(value, label: str) -> int:
        if value is None or not float(value).is_integer():
            raise InvalidSettingError(f"{label} must be a whole number, got {value!r}")
        return int(value)

    return ExperimentGrid(sets=sets, prompts=prompts, ks=parse_ks(data[tab.ks]),
                          temperatures=parse_temperatures(data[tab.temps]),
                          proposers=tuple(data[tab.proposers] or ()),
                          drafts=parse_names(data[tab.drafts], "draft models"),
                          draft_precisions=tuple(data[tab.draft_precs] or ()),
                          target_precisions=tuple(data[tab.target_precs] or ()),
                          target=(data[tab.target] or "").strip(),
                          prompts_per_set=whole(data[tab.per_set], "prompts per set"),
                          max_new_tokens=whole(data[tab.tokens], "new tokens"), seed=whole(data[tab.seed], "seed"))


def form_values(grid: dict) -> list:
    """A saved grid back into the form (in FORM's order)."""
    sets = [s for s in grid["sets"] if s != OWN]
    return [sets, "\n".join(grid["prompts"]), ", ".join(map(str, grid["ks"])),
            ", ".join(f"{t:g}" for t in grid["temperatures"]), list(grid["proposers"]), grid["target"],
            ", ".join(grid["drafts"]), list(grid["draft_precisions"]), list(grid["target_precisions"]),
            grid["prompts_per_set"], grid["max_new_tokens"], grid["seed"]]


def _views(tab: ExperimentsTab, rows: list[dict]) -> dict:
    return {tab.table: table_frame(rows), tab.speedup: speedup_chart(rows), tab.accept: acceptance_chart(rows)}


def _downloads(tab: ExperimentsTab, paths: dict | None) -> dict:
    if paths is None:
        return {getattr(tab, name): gr.update(value=None, visible=False) for name in DOWNLOADS}
    return {tab.download_csv: gr.update(value=str(paths["csv"]), visible=True),
            tab.download_json: gr.update(value=str(paths["json"]), visible=True),
            tab.download_html: gr.update(value=str(paths["html"]), visible=True)}


def run_experiment(ctx: AppContext, tab: ExperimentsTab, data: dict, session: str):
    try:
        grid = read_grid(tab, data)
    except EngineError as err:
        yield {tab.progress: error_html(error_message(err))}
        return
    seconds, estimate = ctx.grid_estimate(grid)
    if (seconds is None or seconds > CONFIRM_ABOVE_S) and data.get(tab.confirming) != grid:
        yield {tab.progress: info_html(f"This grid takes {estimate}. Press {RUN_ANYWAY} to start it, or choose "
                                       "fewer values."), tab.run: gr.update(value=RUN_ANYWAY), tab.confirming: grid}
        return
    rows, result = [], None
    yield {tab.progress: progress_html(0, 1, f"Starting: {estimate}"), tab.run: gr.update(value=RUN),
           tab.confirming: None, **_views(tab, rows), **_downloads(tab, None)}
    with ctx.cancels.running(session) as flag:
        try:
            for update in ctx.engine.run_experiment(grid, flag):
                out = {tab.progress: progress_html(update.done, update.total, update.message, update.loading)}
                if update.row is not None:
                    rows.append(update.row)
                    out.update(_views(tab, rows))
                result = update.result or result
                yield out
        except EngineError as err:  # e.g. a model that does not exist, or a pair that cannot pair
            yield {tab.progress: error_html(error_message(err))}
            return
    doctor = data[tab.doctor_state]
    if doctor and doctor.get("target") == grid.target:
        result["doctor"] = doctor
    paths = save_result(result, tempfile.mkdtemp(prefix="speclens-experiment-"))
    yield {tab.result: result, **_views(tab, rows), **_downloads(tab, paths),
           tab.doctor_out: doctor_html(result.get("doctor"), rows),
           tab.progress: progress_html(len(rows), len(grid.cells()), f"{result_message(result)} · saved "
                                       f"{paths['json'].name} and the report")}


def result_message(result: dict) -> str:
    n = len(result["rows"])
    return f"Stopped after {n} cells" if result.get("stopped") else f"Finished {n} cells"


def run_doctor(ctx: AppContext, tab: ExperimentsTab, data: dict, session: str):
    kinds = tuple(data[tab.sets] or ()) or ("code",)
    yield {tab.doctor_out: progress_html(0, 1, "Pair doctor: measuring the loaded pair and probing "
                                               f"{', '.join(kinds)}…", loading=True)}
    with ctx.cancels.running(session) as flag:
        try:
            report = ctx.engine.pair_doctor(kinds, 24, flag).to_dict()
        except EngineError as err:
            yield {tab.doctor_out: error_html(error_message(err))}
            return
    rows = (data[tab.result] or {}).get("rows", [])
    yield {tab.doctor_out: doctor_html(report, rows), tab.doctor_state: report}


def show_saved(tab: ExperimentsTab, path: str | None) -> dict:
    """A saved JSON: its table, plots and doctor, the downloads again, and its grid in the form."""
    if not path:
        return {}
    try:
        result = load_result(path)
    except EngineError as err:
        return {tab.progress: error_html(error_message(err))}
    paths = save_result(result, tempfile.mkdtemp(prefix="speclens-experiment-"))
    rows = result["rows"]
    return {**_views(tab, rows), **_downloads(tab, paths), tab.result: result,
            tab.doctor_out: doctor_html(result.get("doctor"), rows),
            **dict(zip(tab.form(), form_values(result["grid"]))),
            tab.progress: progress_html(len(rows), len(rows), f"Loaded a run from {result['created']}: "
                                                              "press Run grid to run it again")}


def make_experiment_handlers(ctx: AppContext, tab: ExperimentsTab) -> dict:
    def run(data: dict, request: gr.Request):
        yield from run_experiment(ctx, tab, data, session_id(request))

    def doctor(data: dict, request: gr.Request):
        yield from run_doctor(ctx, tab, data, session_id(request))

    def stop(request: gr.Request):
        ctx.cancels.cancel(session_id(request))

    def load(path):
        return show_saved(tab, path)

    return dict(run=run, doctor=doctor, stop=stop, load=load)


def wire(ctx: AppContext, tab: ExperimentsTab) -> None:
    h = make_experiment_handlers(ctx, tab)
    tab.run.click(h["run"], {*tab.form(), tab.doctor_state, tab.confirming}, [*tab.views(), tab.run, tab.confirming],
                  api_name="run_experiment", **UNTRACKED, **ENGINE)
    tab.doctor.click(h["doctor"], {tab.sets, tab.result}, [tab.doctor_out, tab.doctor_state], api_name="pair_doctor",
                     **UNTRACKED, **ENGINE)
    tab.stop.click(h["stop"], None, None, queue=False, api_visibility="private")
    tab.load.upload(h["load"], [tab.load], [*tab.views(), *tab.form()], api_visibility="private",
                    show_progress_on=[tab.progress])  # not on the table or the plots (app/tabs/engine_queue.py)
