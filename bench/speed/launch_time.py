"""How long ``python launch.py`` takes until a user is served, as a new user meets it: from the command to the page
answering and to a first ``/v1`` answer, then until the pair's figures are in (measured beside serving), and what
the pair said meanwhile. The first launch starts from an empty cache directory (models assembled from their
packages), each later one from what the first left (kept tokenizer folders and figures).

    python -m bench.speed.launch_time                      # the default pair: a first and a second launch
    python -m bench.speed.launch_time --busy               # the same with a busy loop on every CPU beside it
    python -m bench.speed.launch_time --json out/launch.json -- --target smollm2-135m-instruct --draft smollm2-135m-instruct

Each launch runs with ``--no-browser`` on a free port; arguments after ``--`` go to launch.py.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ASK = {"model": "speclens", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}


@dataclass
class Launch:
    page_s: float  # from the command to the page answering
    v1_s: float  # to the first /v1 answer (4 tokens)
    figures_s: float | None  # to the pair's figures being in (None: not within the wait)
    converted: bool  # the log said it converted weights
    while_serving: str  # what /v1's x_identity said when the page first answered
    figures: str  # what it said once the figures were in (when and how, or flagged)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, body: dict | None = None, timeout: float = 300) -> dict | None:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            text = r.read()
            return json.loads(text) if r.headers.get_content_type() == "application/json" else {}
    except OSError:
        return None


def _identity(base: str) -> dict:
    models = _get(base + "/v1/models", timeout=10) or {}
    return (models.get("data") or [{}])[0].get("x_identity") or {}


def one_launch(cache_dir: Path, launch_args: list[str], figures_timeout_s: float) -> Launch:
    port, log = _free_port(), []
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "launch.py", "--no-browser", "--port", str(port), "--cache-dir",
                             str(cache_dir), *launch_args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    threading.Thread(target=lambda: log.extend(proc.stdout), daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    try:
        while _get(base + "/", timeout=5) is None:
            if proc.poll() is not None:
                raise SystemExit(f"launch.py exited with {proc.returncode}:\n{''.join(log)[-3000:]}")
            time.sleep(0.1)
        page_s = time.perf_counter() - start
        serving = _identity(base)
        if _get(base + "/v1/chat/completions", ASK) is None:
            raise SystemExit(f"/v1 did not answer:\n{''.join(log)[-3000:]}")
        v1_s = time.perf_counter() - start
        figures_s, identity = None, serving
        while time.perf_counter() - start < page_s + figures_timeout_s:
            identity = _identity(base)
            if identity and not identity.get("measuring"):
                figures_s = time.perf_counter() - start
                break
            time.sleep(0.5)
        return Launch(page_s, v1_s, figures_s, any("Converting" in line for line in log),
                      "measuring" if serving.get("measuring") else serving.get("measured", ""),
                      identity.get("measured", ""))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def busy_cpus(on: bool):
    """A ``while True: pass`` process per CPU while the block runs (``on``), as a busy machine has beside it."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 1)] \
        if on else []
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    launch_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.speed.launch_time", description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=2, help="launches on the same cache directory (default 2)")
    p.add_argument("--busy", action="store_true", help="a busy loop on every CPU beside the launches")
    p.add_argument("--figures-timeout", type=float, default=300.0,
                   help="seconds to wait for the pair's figures after the page answers (default 300)")
    p.add_argument("--cache-dir", default=None, help="the cache directory (default: a new empty one)")
    p.add_argument("--json", default=None, help="also write the launches here")
    args = p.parse_args(argv)
    if args.launches < 1:
        p.error("--launches takes 1 or more")
    return args, launch_args


def main(argv: list[str] | None = None) -> list[Launch]:
    args, launch_args = parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="speclens-launch-") as empty, busy_cpus(args.busy):
        cache_dir = Path(args.cache_dir or empty)
        launches = [one_launch(cache_dir, launch_args, args.figures_timeout) for _ in range(args.launches)]
    print(f"{'launch':<8}{'page s':>8}{'/v1 s':>8}{'figures s':>11}  converted  while serving -> figures")
    for i, run in enumerate(launches, 1):
        figures = "-" if run.figures_s is None else f"{run.figures_s:.1f}"
        print(f"{i:<8}{run.page_s:>8.1f}{run.v1_s:>8.1f}{figures:>11}  {str(run.converted):<9}  "
              f"{run.while_serving or '-'} -> {run.figures or '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps({"busy": args.busy, "launch_args": launch_args,
                                               "launches": [asdict(r) for r in launches]}, indent=1))
    return launches


if __name__ == "__main__":
    main()
