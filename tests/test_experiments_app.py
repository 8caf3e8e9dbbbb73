"""The Experiments tab's handlers on hand-made cells (no models): the form's errors, streaming rows, Stop, the
downloads, escaping, and a saved run reloaded into the views and the form."""
from __future__ import annotations

import csv
import json

from app.baseline import BaselineStore
from app.context import AppContext
from engine.lab.report.files import load_result, report_html
from app.tabs.experiments import FORM, make_experiment_handlers, read_grid, run_doctor, run_experiment, show_saved
from engine.lab.grid import OWN
from engine.lab.results import DoctorReport, LabUpdate, PromptRun, cell_row
from engine.speed.costmodel import StepCosts, break_even_alpha
from tests.test_render import IMG, SCRIPT, FakeEngine, assert_inert

COSTS = StepCosts(verify_fixed_s=0.05, verify_per_token_s=0.004, draft_per_token_s=0.012)


def fake_experiment(grid, cancel):
    """Each cell: its prompts accepted 3 of 4 draft tokens per step, at a speed that grows with k."""
    cells = grid.cells()
    yield LabUpdate(0, len(cells), f"{len(cells)} cells")
    rows = []
    for i, cell in enumerate(cells):
        if cancel is not None and cancel.is_set():
            break
        k = 4 if cell.k == "adaptive" else cell.k
        runs = [PromptRun(token_ids=(1, 2, 3, 4), seconds=1.0 / k, steps=1, proposed=k, accepted=k - 1,
                          rejected_steps=1, accepted_by_pos=(1,) * (k - 1) + (0,), proposed_by_pos=(1,) * k)]
        base = [PromptRun(token_ids=(1, 2, 3, 4), seconds=1.0)]
        fidelity = {"n_tokens": 40, "chi2": 3.0, "p_value": 0.5, "counts": [8] * 5, "passed": True}
        rows.append(cell_row(grid, cell, runs, base, COSTS, None if cell.temperature == 0 else fidelity))
        yield LabUpdate(i + 1, len(cells), f"Done: {cell.key}", row=rows[-1])
    yield LabUpdate(len(rows), len(cells), "end", result={
        "version": 1, "created": "2026-11-30T20:00:00Z", "seconds": 1.0, "grid": grid.to_dict(),
        "machine": {"cpu": SCRIPT, "kind": "test", "threads": 2, "torch": "x"}, "stopped": len(rows) < len(cells),
        "rows": rows, "prompts": {s: list(grid.set_prompts(s)) for s in grid.all_sets()}, "calibration": []})


def fake_doctor(kinds):
    return DoctorReport(target="t", draft=IMG, target_precision="bf16", draft_precision="nf4", vocab_same=True,
                        vocab_sizes=(49152, 49152), template_same=False, template_note="differ",
                        memory_gb={"bf16": {"target": 0.27, "draft": 0.27}}, kv_mb_per_1k_tokens={"target": 9.0,
                                                                                                  "draft": 9.0},
                        t_draft_s=0.012, t_verify_s={1: 0.054, 8: 0.082}, costs=COSTS,
                        break_even={k: break_even_alpha(COSTS, k) for k in (1, 2, 4, 8)},
                        probes={kind: {"alpha": 0.7, "prompts": 3, "tokens": 24, "best_k": 4,
                                       "predicted": {k: COSTS.speedup(0.7, k) for k in (1, 2, 4, 8)}}
                                for kind in kinds})


ELEMS = {n: n for n in (*FORM, "exp_progress", "exp_table", "exp_speedup", "exp_accept", "exp_doctor_out", "exp_csv",
                        "exp_json", "exp_html", "exp_result", "exp_doctor_state")}


def form(**kw) -> dict:
    data = dict(exp_sets=["code"], exp_prompts=SCRIPT, exp_ks="2, 6", exp_temps="0, 1", exp_proposers=["draft"],
                exp_target="t", exp_drafts="d", exp_draft_precs=["nf4"], exp_target_precs=["bf16"], exp_per_set=1,
                exp_tokens=8, exp_seed=0, exp_doctor_state={}, exp_result={})
    return {ELEMS[k]: v for k, v in {**data, **kw}.items()}


def test_a_grid_streams_rows_and_saves_escaped_files(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    updates = list(run_experiment(ctx, ELEMS, form(), "s1"))
    last = updates[-1]
    rows = last["exp_result"]["rows"]
    assert len(rows) == 8 and {r["prompt_set"] for r in rows} == {"code", OWN}  # 2 sets x 2 k x 2 temperatures
    assert len(last["exp_table"]) == 8
    assert last["exp_speedup"].count('class="predicted-curve"') == 4  # one curve per set x temperature
    assert last["exp_speedup"].count('class="measured-point"') == 4
    assert last["exp_accept"].count('class="accept-line"') == 8
    with open(last["exp_csv"]["value"]) as f:
        table = list(csv.DictReader(f))
    assert len(table) == 8 and table[0]["command"].startswith(
        "python -m bench.speed.modes --prompts experiment.json --prompt-set code")
    report = open(last["exp_html"]["value"]).read()
    assert "<script" not in report.replace(SCRIPT, "") and "&lt;script&gt;" in report  # the own prompt, escaped
    assert "http" not in report.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing to fetch
    assert_inert(last["exp_speedup"] + last["exp_accept"])


def test_bad_input_says_why_and_stop_keeps_the_finished_cells(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    for bad, words in [(dict(exp_ks="2, two"), "&#x27;two&#x27;"), (dict(exp_temps="hot"), "&#x27;hot&#x27;"),
                       (dict(exp_proposers=[]), "proposers"), (dict(exp_tokens=2.5), "whole number")]:
        out = list(run_experiment(ctx, ELEMS, form(**bad), "s1"))
        assert len(out) == 1 and words in out[0]["exp_progress"]
    handlers = make_experiment_handlers(ctx, ELEMS)
    stopped = False
    for update in run_experiment(ctx, ELEMS, form(), "s2"):
        if not stopped and update.get("exp_table") is not None and len(update["exp_table"]) == 1:
            stopped = ctx.cancels.cancel("s2")  # what the Stop button does
    assert stopped and handlers["stop"]
    assert update["exp_result"]["stopped"] and len(update["exp_result"]["rows"]) == 1
    assert "Stopped after 1 cells" in update["exp_progress"]


def test_a_saved_run_reloads_into_the_views_and_the_form(tmp_path):
    ctx = AppContext(FakeEngine([]), BaselineStore(tmp_path / "b.json"))
    doctor = list(run_doctor(ctx, ELEMS, form(), "s3"))[-1]
    assert "Pair doctor" in doctor["exp_doctor_out"] and "&lt;img" in doctor["exp_doctor_out"]
    last = list(run_experiment(ctx, ELEMS, form(exp_doctor_state=doctor["exp_doctor_state"]), "s4"))[-1]
    saved = load_result(last["exp_json"]["value"])
    assert saved["doctor"]["draft"] == IMG and json.loads(json.dumps(saved)) == saved
    shown = show_saved(ELEMS, last["exp_json"]["value"])
    assert len(shown["exp_table"]) == 8 and 'class="predicted-curve"' in shown["exp_speedup"]
    assert shown["exp_ks"] == "2, 6" and shown["exp_prompts"] == SCRIPT and shown["exp_sets"] == ["code"]
    assert read_grid(ELEMS, {**form(), **{ELEMS[n]: shown[n] for n in FORM}}) == read_grid(ELEMS, form())
    assert "measured" in report_html(saved) and "&lt;img" in report_html(saved)
    (tmp_path / "bad.json").write_text("{not json")
    assert "could not read" in show_saved(ELEMS, str(tmp_path / "bad.json"))["exp_progress"]
    (tmp_path / "other.json").write_text(json.dumps({"rows": []}))
    assert "not a saved SpecLens experiment" in show_saved(ELEMS, str(tmp_path / "other.json"))["exp_progress"]
