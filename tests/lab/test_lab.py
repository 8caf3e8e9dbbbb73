"""Experiments (engine/lab): the grid's validation, a run on the tiny pair, reruns, Stop, the distribution check,
the pair doctor, and the saved JSON re-rendered as the HTML report."""
from __future__ import annotations

import json
import threading

import pytest
import torch

from engine.chat_engine import ChatEngine
from engine.config import SamplingConfig
from engine.backends.torch_runner import ModelRunner
from engine.decode.sampling import logits_to_probs, make_generator, sample
from engine.errors import InvalidSettingError
from engine.lab.fidelity import pit_values, uniformity
from engine.lab.grid import ADAPTIVE, OWN, ExperimentGrid, parse_ks, parse_temperatures
from engine.costs.costmodel import StepCosts, break_even_alpha
from tests.helpers.tiny import tiny_pair
from tests.helpers.constants import SMOL

GRID = dict(sets=(OWN,), prompts=("abc def abc", "hello world"), target="tiny-target", drafts=("tiny-draft",),
            draft_precisions=("fp32",), target_precisions=("fp32",), max_new_tokens=12, seed=7)


@pytest.fixture(scope="module")
def engine():
    target, draft = tiny_pair()
    e = ChatEngine()
    e.use_models(target, draft)
    return e


def run(engine, grid, cancel=None):
    updates = list(engine.run_experiment(grid, cancel))
    assert updates[-1].result is not None
    return updates


def test_grid_parsing_and_validation_say_what_is_wrong():
    assert parse_ks("2, 6,adaptive, 2") == (2, 6, ADAPTIVE)
    assert parse_temperatures("0, 0.7,1") == (0.0, 0.7, 1.0)
    for bad, words in [("2, x", "'x'"), ("0", "[1, 64]"), ("", "at least one")]:
        with pytest.raises(InvalidSettingError, match=words):
            parse_ks(bad)
    with pytest.raises(InvalidSettingError, match="temperature"):
        ExperimentGrid(temperatures=(9.0,))
    with pytest.raises(InvalidSettingError, match="unknown prompt set"):
        ExperimentGrid(sets=("poetry",))
    with pytest.raises(InvalidSettingError, match="own"):
        ExperimentGrid(sets=(OWN,))
    with pytest.raises(InvalidSettingError, match="cells"):
        ExperimentGrid(ks=tuple(range(1, 17)), temperatures=(0, 0.5, 1), proposers=("draft", "lookup", "hybrid"))
    grid = ExperimentGrid(ks=(2, 6), temperatures=(0, 1))
    assert len(grid.cells()) == 4 and ExperimentGrid.from_dict(json.loads(json.dumps(grid.to_dict()))) == grid


def test_a_2x2_grid_gives_four_rows_with_predictions_and_checks(engine):
    grid = ExperimentGrid(ks=(2, 6), temperatures=(0.0, 1.0), **GRID)
    updates = run(engine, grid)
    rows = updates[-1].result["rows"]
    assert [(r["k"], r["temperature"]) for r in rows] == [(2, 0.0), (6, 0.0), (2, 1.0), (6, 1.0)]
    assert [u.done for u in updates] == sorted(u.done for u in updates)
    assert updates[-1].done == updates[-1].total == 4 * 2 + 2 * 2  # cells' prompts + a baseline per temperature
    for r in rows:
        assert r["speedup"] > 0 and r["predicted_speedup"] > 0 and 0 <= r["acceptance"] <= 1
        assert len(r["acceptance_by_position"]) <= r["k"] and "--k %d" % r["k"] in r["command"]
    greedy = [r for r in rows if r["temperature"] == 0]
    assert all(r["identical"] == "2/2" for r in greedy)  # lossless: the speculative tokens are the target's
    sampled = [r for r in rows if r["temperature"] > 0]
    assert all(r["identical"] is None and r["distribution_check"]["n_tokens"] == r["new_tokens"] for r in sampled)


def test_rerunning_a_saved_grid_gives_the_same_tokens_and_accept_counts(engine):
    grid = ExperimentGrid(ks=(3,), temperatures=(0.0, 1.0), **GRID)
    first = run(engine, grid)[-1].result
    again = run(engine, ExperimentGrid.from_dict(json.loads(json.dumps(first))["grid"]))[-1].result
    assert [r["token_ids"] for r in first["rows"]] == [r["token_ids"] for r in again["rows"]]
    assert [r["accepted_counts"] for r in first["rows"]] == [r["accepted_counts"] for r in again["rows"]]
    other_seed = run(engine, ExperimentGrid(ks=(3,), temperatures=(1.0,), **{**GRID, "seed": 8}))[-1].result
    assert other_seed["rows"][0]["token_ids"] != first["rows"][1]["token_ids"]  # the seed is what fixes them


def test_stop_mid_run_ends_with_the_finished_cells(engine):
    grid = ExperimentGrid(ks=(2, 4, 6), temperatures=(0.0,), **GRID)
    cancel = threading.Event()
    updates = []
    for update in engine.run_experiment(grid, cancel):
        updates.append(update)
        if update.row is not None:
            cancel.set()  # Stop after the first cell
    result = updates[-1].result
    assert result["stopped"] and len(result["rows"]) == 1 and "Stopped after 1 of 3" in updates[-1].message


def test_the_distribution_check_passes_target_samples_and_catches_greedy_tokens():
    target, _ = tiny_pair()
    runner = ModelRunner(target.model, target.vocab_size)
    prompt = [5, 9, 12]
    sampling = SamplingConfig(temperature=1.0)

    def pits(pick_greedy: bool) -> list[float]:
        gen, values = make_generator(3), []
        for _ in range(6):
            runner.reset()
            context, probs = list(prompt), []
            for _ in range(20):
                p = logits_to_probs(runner.forward(context[len(runner.tokens):], n_logits=1)[-1], sampling)
                context.append(int(torch.argmax(p)) if pick_greedy else sample(p, sampling, gen))
                probs.append(p)
            values += pit_values(torch.stack(probs), context[len(prompt):], gen)
        return values

    assert uniformity(pits(False)).passed is True
    assert uniformity(pits(True)).passed is False
    assert uniformity([0.5] * 3).p_value is None  # too few tokens: no verdict


def test_break_even_acceptance_solves_the_cost_model():
    costs = StepCosts(verify_fixed_s=0.05, verify_per_token_s=0.005, draft_per_token_s=0.01)
    for k in (1, 4, 8):
        alpha = break_even_alpha(costs, k)
        assert abs(costs.speedup(alpha, k) - 1.0) < 1e-3
    assert break_even_alpha(StepCosts(0.0, 0.05, 0.05), 8) is None  # compute-bound verify: never pays


def test_the_pair_doctor_reports_the_pair(engine):
    report = engine.pair_doctor(kinds=("code",), probe_tokens=8)
    assert report.vocab_same and report.template_same and set(report.t_verify_s) == {1, 2, 4, 8, 16}
    assert report.memory_gb["fp32"]["target"] == pytest.approx(2 * report.memory_gb["bf16"]["target"])
    probe = report.probes["code"]
    assert 0 <= probe["alpha"] <= 1 and probe["best_k"] in probe["predicted"]
    assert json.dumps(report.to_dict())


def test_a_saved_run_reloads_and_renders_the_report_again(engine, tmp_path):
    from app.views.report.files import load_result, report_html, save_result

    grid = ExperimentGrid(ks=(2, 6), temperatures=(0.0, 1.0), **GRID)
    result = run(engine, grid)[-1].result
    paths = save_result(result, tmp_path)
    again = load_result(paths["json"])
    html = report_html(again)
    assert html == paths["html"].read_text()  # the same report from the JSON alone, no models
    assert html.count('class="predicted-curve"') == 2 and html.count('class="measured-point"') == 2
    assert html.count("<tr>") == 1 + 4
    command = rows[0]["command"] if (rows := again["rows"]) else ""
    assert "python -m bench.speed.modes --prompts experiment.json --prompt-set own" in command and command in html


def test_a_cells_command_reads_its_prompts_from_the_saved_json(tmp_path):
    import shlex

    from app.views.report.files import save_result
    from bench.speed.modes import read_prompts

    grid = ExperimentGrid(ks=(2,), **GRID)
    paths = save_result({"version": 1, "created": "now", "grid": grid.to_dict(), "rows": [],
                         "prompts": {OWN: list(grid.set_prompts(OWN))}}, tmp_path)
    from engine.lab.grid import bench_command
    args = shlex.split(bench_command(grid, grid.cells()[0]))
    assert args[args.index("--prompts") + 1] == paths["json"].name
    prompts = read_prompts(str(paths["json"]), args[args.index("--prompt-set") + 1])
    assert [p["prompt"] for p in prompts] == list(GRID["prompts"])
    with pytest.raises(ValueError, match="--prompt-set"):  # bench.speed.modes turns it into exit 2 with this line
        read_prompts(str(paths["json"]), "code")


@pytest.mark.real
def test_a_real_pair_reruns_to_the_same_tokens_and_accept_counts(real_models):
    """SmolLM2-135M (int8-weight target, int8-dynamic draft: the pair tests/backends/test_identity_check.py measures,
    whose figures the pooled models keep): the saved grid run again on the same machine."""
    e = real_models.engine(SMOL, "int8-weight", SMOL, "int8-dynamic")
    grid = ExperimentGrid(sets=("code",), ks=(3,), temperatures=(0.0, 1.0), target=SMOL,
                          drafts=(SMOL,), draft_precisions=("int8-dynamic",),
                          target_precisions=("int8-weight",), prompts_per_set=1, max_new_tokens=24, seed=3)
    first = run(e, grid)[-1].result
    again = run(e, ExperimentGrid.from_dict(json.loads(json.dumps(first["grid"]))))[-1].result
    assert [r["token_ids"] for r in first["rows"]] == [r["token_ids"] for r in again["rows"]]
    assert [r["accepted_counts"] for r in first["rows"]] == [r["accepted_counts"] for r in again["rows"]]
    assert first["rows"][0]["identical"] == "1/1"  # int8-weight keeps the target lossless


@pytest.mark.real  # the CLI in a subprocess, on SmolLM2-135M
def test_the_experiment_cli_prints_its_estimate_before_it_runs(tmp_path):
    """At the target-only speed the app measured on this machine: a record in the cache directory's baselines.json,
    where launch.py keeps its measurements."""
    import os
    import subprocess
    import sys

    from app.baseline import BaselineStore, duration, speed_key
    from engine.lab.grid import estimated_seconds
    from engine.models.loading import default_device
    from tests.helpers.server import ROOT, link_models

    link_models(tmp_path)
    name, speed = SMOL, 3.5
    BaselineStore(tmp_path / "baselines.json").put(speed_key(name, "gguf", str(default_device())),
                                                   {"tokens_per_s": speed, "measured_at": "2025-06-01 09:30"})
    grid = ExperimentGrid(sets=("code",), ks=(2,), temperatures=(0.0,), target=name, drafts=(name,),
                          draft_precisions=("gguf",), target_precisions=("gguf",), prompts_per_set=1,
                          max_new_tokens=4)
    args = ["--sets", "code", "--ks", "2", "--temperatures", "0", "--target", name, "--draft", name, "--dtype",
            "gguf", "--draft-dtype", "gguf", "--prompts-per-set", "1", "--max-new-tokens", "4"]
    done = subprocess.run([sys.executable, "-m", "bench.speed.experiment", *args, "--out", str(tmp_path / "run")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "SPECLENS_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    estimate = next(i for i, line in enumerate(lines) if line.startswith("estimate: "))
    assert f"about {duration(estimated_seconds(grid, speed))}: {sum(grid.generations())} generations" in lines[estimate]
    assert f"{speed:.1f} tok/s" in lines[estimate] and "2025-06-01 09:30" in lines[estimate]
    assert estimate < next(i for i, line in enumerate(lines) if line.startswith("set "))  # before the results


def test_auto_precisions_show_what_they_resolved_to():
    from app.views.report.views import cell_text

    row = {"draft_precision": "auto", "draft_precision_used": "int8-dynamic", "target_precision": "bf16",
           "target_precision_used": "bf16"}
    assert cell_text(row, "draft_precision") == "auto → int8-dynamic" and cell_text(row, "target_precision") == "bf16"
