"""Run a bench command line with its loaders replaced by a tripwire (tests/bench/test_bench_cli.py).

``python -m tests.helpers.tripwire [--models] TOOL ARGS...`` runs ``python -m TOOL ARGS...`` in this process, with
the embedder loader, and with ``--models`` the model and tokenizer loaders, replaced: reaching one prints
"LOADING" on stderr and exits with TRIPWIRE. A command that refuses its arguments exits before any of them.
"""
from __future__ import annotations

import runpy
import sys

TRIPWIRE = 99  # the exit status of a run that reached a loader


def tripwire(*args, **kwargs):
    print("LOADING", file=sys.stderr)
    raise SystemExit(TRIPWIRE)


def main(argv: list[str]) -> None:
    models = argv[:1] == ["--models"]
    tool, *args = argv[1:] if models else argv
    import engine.cache.embedder
    engine.cache.embedder.load_default_embedder = tripwire
    if models:
        import engine.models.loading
        for name in ("load_model", "load_tokenizer", "resolve_source"):
            setattr(engine.models.loading, name, tripwire)
    sys.argv = [tool, *args]
    runpy.run_module(tool, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
