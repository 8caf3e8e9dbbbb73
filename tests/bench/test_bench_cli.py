"""The bench command lines refuse a bad argument with one sentence and exit status 2, before anything loads.

Each case runs the real command in a subprocess whose model and embedder loaders are replaced by a tripwire:
reaching one exits 99 with "LOADING" on stderr. The valid control case must hit the tripwire (so it does catch
a load); every bad case must exit 2 without reaching it.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.server import free_port
from tests.helpers.tripwire import TRIPWIRE

ROOT = Path(__file__).resolve().parents[2]


def run_tool(tool: str, *args: str) -> subprocess.CompletedProcess:
    """``tool`` under the tripwire: the loaders a bench run calls first are replaced, the model pair (and any
    conversion) for bench.speed.modes, the embedder for both."""
    models = ["--models"] if tool == "bench.speed.modes" else []
    return subprocess.run([sys.executable, "-m", "tests.helpers.tripwire", *models, tool, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())})


def assert_refused(result: subprocess.CompletedProcess, tool: str, *expected: str) -> None:
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


@pytest.mark.parametrize("args, expected", SPEED_CASES, ids=[" ".join(a) for a, _ in SPEED_CASES])
def test_bench_speed_refuses_a_bad_argument_before_loading(files, args, expected):
    assert_refused(run_tool("bench.speed.modes", "--prompts", str(files["prompts.jsonl"]), *fill(args, files)),
                   "bench.speed.modes", *expected)


CACHE_EVAL_CASES = [
    (["--pairs", "{missing}"], ["missing.jsonl", "No such file"]),
    (["--pairs", "{not-json.jsonl}"], ["not-json.jsonl:2", "not JSON"]),
    (["--pairs", "{no-same.jsonl}"], ["no-same.jsonl:1", "a, b, same"]),
    (["--pairs", "{pairs.jsonl}", "--threshold", "7"], ["cache threshold", "got 7.0"]),
    (["--latency", "--entries", "-5"], ["--entries", "'-5'"]),
    (["--latency", "--cache-url", "redis://:hunter2@127.0.0.1:{port}/0"], ["Redis cannot be used", "***"]),
]


@pytest.mark.parametrize("args, expected", CACHE_EVAL_CASES, ids=[" ".join(a) for a, _ in CACHE_EVAL_CASES])
def test_cache_eval_refuses_a_bad_argument_before_loading(files, args, expected):
    result = run_tool("bench.cache.evaluate", *fill(args, files | {"port": free_port()}))  # nothing listens there
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


@pytest.mark.parametrize("tool, args", [("bench.speed.modes", ["--prompts", "{prompts.jsonl}", "--k", "auto"]),
                                        ("bench.cache.evaluate", ["--pairs", "{pairs.jsonl}"])])
def test_valid_arguments_go_on_to_load(files, tool, args):
    """The control: the tripwire above does catch a load, so the refusals really came before one."""
    result = run_tool(tool, *fill(args, files))
    assert result.returncode == TRIPWIRE and "LOADING" in result.stderr, result.stderr
