"""The bench command lines refuse a bad argument with one sentence and exit status 2, before anything loads.

Each case runs the real command with its model and embedder loaders replaced by a tripwire: reaching one exits 99
with "LOADING" on stderr. The valid control case must hit the tripwire (so it does catch a load); every bad case
must exit 2 without reaching it. All the cases run one after another in one subprocess (``--batch``), so the
imports are paid once: each command's main runs afresh, and stderr and the exit status are its own.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.server import free_port
from tests.helpers.tripwire import TRIPWIRE

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Result:
    returncode: int
    stderr: str


def run_tools(cases: list[tuple[str, list[str]]]) -> list[Result]:
    """Each ``(tool, args)`` under the tripwire, in one subprocess: the loaders a bench run calls first are
    replaced, the model pair (and any conversion) for bench.speed.modes, the embedder for both."""
    batch = [{"tool": tool, "args": args, "models": tool == "bench.speed.modes"} for tool, args in cases]
    done = subprocess.run([sys.executable, "-m", "tests.helpers.tripwire", "--batch"], cwd=ROOT, input=json.dumps(batch),
                          capture_output=True, text=True, timeout=300, check=True,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    return [Result(**r) for r in json.loads(done.stdout)]


def assert_refused(result: Result, tool: str, *expected: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "LOADING" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0]), result.stderr
    assert errors[0].startswith(f"python -m {tool}: error: "), errors
    for text in expected:
        assert text in errors[0], errors[0]


def fill(args: list[str], names: dict) -> list[str]:
    """``{name}`` in each argument -> that file's path (or value)."""
    out = []
    for arg in args:
        for name, value in names.items():
            arg = arg.replace("{" + name + "}", str(value))
        out.append(arg)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bench-cli")
    contents = {"prompts.jsonl": '{"id": "a", "prompt": "Say hi."}\n',
                "pairs.jsonl": '{"a": "hi", "b": "hello", "same": true}\n',
                "fake.gguf": "not a GGUF model, just text",
                "not-json.jsonl": '{"a": "hi", "b": "hello", "same": true}\n{"a": "unfinished\n',
                "no-same.jsonl": '{"a": "hi", "b": "hello"}\n'}
    for name, text in contents.items():
        (d / name).write_text(text)
    return {name: d / name for name in contents} | {"missing": d / "missing.jsonl"}


SPEED_CASES = [
    (["--k", "0"], ["k (draft length)", "got 0"]),
    (["--k", "-1"], ["k (draft length)", "got -1"]),
    (["--k", "10000"], ["k (draft length)", "got 10000"]),
    (["--k", "abc"], ["k (draft length)", "got 'abc'"]),
    (["--target", "no-such-model"], ["unknown model 'no-such-model'"]),
    (["--target", "{fake.gguf}"], ["is not a GGUF model file"]),
    (["--max-new-tokens", "0"], ["max_new_tokens", "got 0"]),
    (["--draft-dtype", "fp8"], ["unknown precision 'fp8'"]),
    (["--prompts", "{missing}"], ["missing.jsonl", "No such file"]),
    (["--repeats", "0"], ["--repeats must be a whole number >= 1", "got 0"]),
]


CACHE_EVAL_CASES = [
    (["--pairs", "{missing}"], ["missing.jsonl", "No such file"]),
    (["--pairs", "{not-json.jsonl}"], ["not-json.jsonl:2", "not JSON"]),
    (["--pairs", "{no-same.jsonl}"], ["no-same.jsonl:1", "a, b, same"]),
    (["--pairs", "{pairs.jsonl}", "--threshold", "7"], ["cache threshold", "got 7.0"]),
    (["--latency", "--entries", "-5"], ["--entries", "'-5'"]),
    (["--latency", "--cache-url", "redis://:hunter2@127.0.0.1:{port}/0"], ["Redis cannot be used", "***"]),
]


VALID_CASES = [("bench.speed.modes", ["--prompts", "{prompts.jsonl}", "--k", "auto"]),
               ("bench.cache.evaluate", ["--pairs", "{pairs.jsonl}"])]


def control_cases(files) -> list[tuple[str, list[str]]]:
    """A refusal, then a load, then the same refusal again, last in the batch (after every other case)."""
    prompts = ["--prompts", str(files["prompts.jsonl"])]
    bad, good = ("bench.speed.modes", [*prompts, "--k", "0"]), ("bench.speed.modes", [*prompts, "--k", "auto"])
    return [bad, good, bad]


@pytest.fixture(scope="module")
def batch(files) -> tuple[dict[tuple[str, tuple[str, ...]], Result], list[Result]]:
    """Every case of this module, run once in one subprocess: by (tool, the arguments as written above), and the
    control sequence's three results."""
    names = files | {"port": free_port()}  # nothing listens there
    cases = ([("bench.speed.modes", ["--prompts", "{prompts.jsonl}", *args]) for args, _ in SPEED_CASES]
             + [("bench.cache.evaluate", args) for args, _ in CACHE_EVAL_CASES] + VALID_CASES)
    done = run_tools([(tool, fill(args, names)) for tool, args in cases] + control_cases(files))
    return {(tool, tuple(args)): result for (tool, args), result in zip(cases, done)}, done[len(cases):]


@pytest.fixture(scope="module")
def results(batch) -> dict[tuple[str, tuple[str, ...]], Result]:
    return batch[0]


@pytest.mark.parametrize("args, expected", SPEED_CASES, ids=[" ".join(a) for a, _ in SPEED_CASES])
def test_bench_speed_refuses_a_bad_argument_before_loading(results, args, expected):
    assert_refused(results["bench.speed.modes", ("--prompts", "{prompts.jsonl}", *args)], "bench.speed.modes",
                   *expected)


@pytest.mark.parametrize("args, expected", CACHE_EVAL_CASES, ids=[" ".join(a) for a, _ in CACHE_EVAL_CASES])
def test_cache_eval_refuses_a_bad_argument_before_loading(results, args, expected):
    result = results["bench.cache.evaluate", tuple(args)]
    assert_refused(result, "bench.cache.evaluate", *expected)
    assert "hunter2" not in result.stderr


def test_cache_eval_writes_the_report_it_prints(files, tmp_path, monkeypatch, capsys):
    """The whole command in-process, a hash embedder in place of the real one: the pairs are read, evaluated,
    printed and written (the parser, the checks, the judge-less run and the JSON report join up)."""
    import bench.cache.evaluate as evaluate
    from engine.cache.embedder import HashEmbedder

    monkeypatch.setattr(evaluate, "load_default_embedder", lambda: HashEmbedder(32))
    out = tmp_path / "report.json"
    assert evaluate.main(["--pairs", str(files["pairs.jsonl"]), "--json", str(out), "--threshold", "0.5"]) == 0
    report = json.loads(out.read_text())
    assert list(report) == ["pairs"] and report["pairs"]["pairs"] == 1 and report["pairs"]["backend"] == "disk"
    assert report["pairs"]["rows"][0]["a"] == "hi" and report["pairs"]["threshold"] == 0.5
    assert "pairs 1 (same 1), threshold 0.50, backend disk" in capsys.readouterr().out


@pytest.mark.parametrize("tool, args", VALID_CASES, ids=[tool for tool, _ in VALID_CASES])
def test_valid_arguments_go_on_to_load(results, tool, args):
    """The control: the tripwire above does catch a load, so the refusals really came before one."""
    result = results[tool, tuple(args)]
    assert result.returncode == TRIPWIRE and "LOADING" in result.stderr, result.stderr


def test_a_batch_runs_each_command_afresh(batch):
    """The batch's own control: a case's exit status and stderr are its own, whatever ran before it in the
    process (every case above, then a refusal, a load and the same refusal again)."""
    first, loaded, again = batch[1]
    assert (first.returncode, loaded.returncode, again.returncode) == (2, TRIPWIRE, 2)
    assert first.stderr == again.stderr and "LOADING" not in again.stderr
