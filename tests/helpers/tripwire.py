"""Run bench command lines with their loaders replaced by a tripwire (tests/bench/test_bench_cli.py).

``python -m tests.helpers.tripwire [--models] TOOL ARGS...`` runs ``python -m TOOL ARGS...`` in this process, with
the embedder loader, and with ``--models`` the model and tokenizer loaders, replaced: reaching one prints
"LOADING" on stderr and exits with TRIPWIRE. A command that refuses its arguments exits before any of them.

``python -m tests.helpers.tripwire --batch`` reads a JSON list of ``{"tool", "args", "models"}`` on stdin and runs
each the same way, one after another in this one process (the imports are paid once), and prints a JSON list of
``{"returncode", "stderr"}``: the exit status and everything the command wrote on stderr, a traceback included.
"""
from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
import traceback

TRIPWIRE = 99  # the exit status of a run that reached a loader
MODEL_LOADERS = ("load_model", "load_tokenizer", "resolve_source")


def tripwire(*args, **kwargs):
    print("LOADING", file=sys.stderr)
    raise SystemExit(TRIPWIRE)


@contextlib.contextmanager
def tripwired(models: bool):
    """The embedder loader, and with ``models`` the model loaders, replaced by the tripwire; restored after."""
    import engine.cache.embedder
    import engine.models.loading
    targets = [(engine.cache.embedder, "load_default_embedder")]
    targets += [(engine.models.loading, name) for name in MODEL_LOADERS] if models else []
    saved = [(module, name, getattr(module, name)) for module, name in targets]
    for module, name, _ in saved:
        setattr(module, name, tripwire)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def run(tool: str, args: list[str], models: bool) -> None:
    with tripwired(models):
        sys.argv = [tool, *args]
        runpy.run_module(tool, run_name="__main__")


def run_captured(case: dict) -> dict:
    """One case: its exit status (0 when it returned) and its stderr."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            run(case["tool"], case["args"], case.get("models", False))
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, (int, type(None))):
                print(e.code, file=sys.stderr)
        except BaseException:  # noqa: BLE001 - reported as the interpreter would: a traceback, status 1
            traceback.print_exc()
            code = 1
    return {"returncode": code, "stderr": err.getvalue()}


def main(argv: list[str]) -> None:
    if argv == ["--batch"]:
        print(json.dumps([run_captured(case) for case in json.load(sys.stdin)]))
        return
    models = argv[:1] == ["--models"]
    tool, *args = argv[1:] if models else argv
    run(tool, args, models)


if __name__ == "__main__":
    main(sys.argv[1:])
