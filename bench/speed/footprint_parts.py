"""What each part of the app holds in resident memory, loaded one after another in this fresh process as launch.py
loads them: torch and transformers imported, the pair loaded (its GGUF files; its load-time figures measured here, or
kept from an earlier launch in the same cache directory), one answer (its llama.cpp contexts), the semantic cache's
MiniLM embedder, Gradio and the app's page built. Each row is the VmRSS it added (read from /proc, Linux) and the
total after it; bench.speed.footprint measures the whole app against llama-server.

    python -m bench.speed.footprint_parts                      # the default pair, the app's cache directory
    python -m bench.speed.footprint_parts --json out/parts.json --cache-dir DIR -- --target NAME --draft NAME

Run it as its own command: what an earlier import in the same process loaded would not be counted again.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

ANSWER = [{"role": "user", "content": "Write a Python function that reverses a string."}]


@dataclass
class Part:
    part: str
    added_mb: float  # VmRSS it added
    total_mb: float  # VmRSS after it


def memory_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of ``pid`` in MB, from /proc/<pid>/status."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024  # kB
    return fields["VmRSS"], fields["VmHWM"]


def launch_pair(launch_args: list[str]) -> tuple[str, str]:
    """The target and draft launch.py loads with ``launch_args`` (its defaults: the catalog's pair)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--target", default=DEFAULT_TARGET)
    p.add_argument("--draft", default=DEFAULT_DRAFT)
    known, _ = p.parse_known_args(launch_args)
    return known.target, known.draft


def measure(steps: list[tuple[str, Callable[[], object]]]) -> list[Part]:
    """Each step run in turn; the resident memory it added since the row before (what a thread the last step
    started took meanwhile counts to this one, so the rows add up to the total). The first row is what the process
    held before."""
    rows = [Part("python and the bench's imports", 0.0, memory_mb(os.getpid())[0])]
    for name, step in steps:
        step()
        after = memory_mb(os.getpid())[0]
        rows.append(Part(name, after - rows[-1].total_mb, after))
    return rows


def app_steps(target: str, draft: str, cache_dir: Path | None, max_tokens: int) -> list[tuple[str, Callable]]:
    """launch.py's parts in its order, each made by the app's own code (``cache_dir``: the app's, None: its
    default, where its models and kept figures are)."""
    held = {}

    def pair():
        from engine.chat_engine import ChatEngine

        held["engine"] = ChatEngine(cache_dir=cache_dir, measure_beside=False)
        held["engine"].load_pair(target, draft)

    def answer():
        from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig

        for _ in held["engine"].generate(ANSWER, SamplingConfig(max_new_tokens=max_tokens), DEFAULT_SPEC,
                                         cache=CACHE_OFF):
            pass

    def embedder():
        from engine.cache.embedder import load_default_embedder

        load_default_embedder().encode(["a question someone asked before"])

    def page():
        from app.baseline import BaselineStore
        from app.context import AppContext
        from app.ui import build_demo

        store = BaselineStore(cache_dir / "baselines.json" if cache_dir else None)
        held["demo"] = build_demo(AppContext(held["engine"], store))

    return [("torch imported", lambda: __import__("torch")),
            ("transformers imported", lambda: __import__("transformers")),
            (f"the pair loaded, its figures measured or kept ({target}, {draft})", pair),
            (f"one answer ({max_tokens} tokens)", answer),
            ("MiniLM embedder (the semantic cache)", embedder),
            ("Gradio and the app's page built", page)]


def main(argv: list[str] | None = None) -> list[Part]:
    argv = list(sys.argv[1:] if argv is None else argv)
    launch_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.speed.footprint_parts", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=32, help="new tokens of the one answer (default 32)")
    p.add_argument("--cache-dir", default=None, help="the app's cache directory (default: the app's default)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    if args.max_tokens < 1:
        p.error("--max-tokens takes 1 or more")
    target, draft = launch_pair(launch_args)
    rows = measure(app_steps(target, draft, Path(args.cache_dir) if args.cache_dir else None, args.max_tokens))
    print(f"{'part':<72}{'added MB':>10}{'total MB':>10}")
    for row in rows:
        print(f"{row.part:<72}{row.added_mb:>10.0f}{row.total_mb:>10.0f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"launch_args": launch_args, "rows": [asdict(r) for r in rows]},
                                              indent=1))
    return rows


if __name__ == "__main__":
    main()
