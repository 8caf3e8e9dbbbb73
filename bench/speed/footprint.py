"""What the app holds in memory against llama-server on the same GGUF files, after the same work (issue 47's bar:
RSS at most 1.2x the peer's).

Two jobs, each on a fresh process of each side, the same prompts (bench/prompts/eval.jsonl, greedy, through each
side's ``/v1/chat/completions``):
- ``concurrent``: N answers at once (default 4), against ``llama-server -m TARGET -md DRAFT -np N -c 32768``;
- ``sequential``: M answers one after another (default 16), against ``-np 1 -c 8192``.
After each job: the process's resident memory (VmRSS) and its peak (VmHWM), read from /proc (Linux).

    python -m bench.speed.footprint                         # the default pair
    python -m bench.speed.footprint --concurrent 4 --sequential 16 --max-tokens 96 --json out/footprint.json
    python -m bench.speed.footprint -- --target smollm2-135m-instruct --draft smollm2-135m-instruct

The app runs with ``--no-browser`` on a free port and a new cache directory (its figures measured once, then kept
for the second job's launch), its pair's figures in before the job starts; arguments after ``--`` go to launch.py.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.peer.server import LlamaServer, ServerConfig, find_llama_server
from bench.speed.footprint_parts import launch_pair, memory_mb
from bench.speed.launch_time import ROOT
from bench.speed.serving_paths import launched_app
from engine.models.sources import gguf_file

PROMPTS = ROOT / "bench" / "prompts" / "eval.jsonl"
PEER_CONTEXT = {"concurrent": 32768, "sequential": 8192}  # llama-server's -c for each job


@dataclass
class Footprint:
    side: str  # "app" or "llama-server"
    job: str  # "concurrent" or "sequential"
    answers: int
    rss_mb: float  # VmRSS after the job
    peak_mb: float  # VmHWM: the most it held
    command: str


def prompts(n: int) -> list[str]:
    """``n`` prompts of the eval set, cycled."""
    texts = [json.loads(line)["prompt"] for line in PROMPTS.read_text().splitlines() if line.strip()]
    return [texts[i % len(texts)] for i in range(n)]


def ask(base: str, prompt: str, max_tokens: int) -> None:
    body = {"model": "speclens", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0.0}
    request = urllib.request.Request(base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=1800) as response:
        response.read()


def run_job(base: str, job: str, n: int, max_tokens: int) -> None:
    """``n`` answers, all at once (``concurrent``) or one after another (``sequential``)."""
    texts = prompts(n)
    if job == "concurrent":
        with ThreadPoolExecutor(n) as pool:
            list(pool.map(lambda text: ask(base, text, max_tokens), texts))
    else:
        for text in texts:
            ask(base, text, max_tokens)


def app_footprint(job: str, n: int, max_tokens: int, cache_dir: Path, launch_args: list[str]) -> Footprint:
    with launched_app(ROOT, str(cache_dir), launch_args, semantic_cache=True) as (base, pid):  # its figures in
        run_job(base, job, n, max_tokens)
        rss, peak = memory_mb(pid)
    command = " ".join(["python launch.py --no-browser --port PORT --cache-dir NEW_DIR", *launch_args])
    return Footprint("app", job, n, rss, peak, command)


def peer_footprint(job: str, n: int, max_tokens: int, binary: Path, target: Path, draft: Path,
                   threads: int) -> Footprint:
    config = ServerConfig(binary, target, "draft-simple", draft, threads=threads, context=PEER_CONTEXT[job],
                          parallel=n if job == "concurrent" else 1)
    with LlamaServer(config) as server:
        run_job(server.url, job, n, max_tokens)
        rss, peak = memory_mb(server.process.pid)
        command = " ".join(str(part) for part in server.process.args)
    return Footprint("llama-server", job, n, rss, peak, command.replace(f"--port {server.port}", "--port PORT"))


def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    argv = list(sys.argv[1:] if argv is None else argv)
    launch_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m bench.speed.footprint", description=__doc__.split("\n\n")[0])
    p.add_argument("--concurrent", type=int, default=4, help="answers at once in the first job (default 4)")
    p.add_argument("--sequential", type=int, default=16, help="answers one after another in the second (default 16)")
    p.add_argument("--max-tokens", type=int, default=96, help="new tokens an answer may have (default 96)")
    p.add_argument("--threads", type=int, default=None, help="llama-server's threads (default: the CPU count)")
    p.add_argument("--llama-server", default=None, help="the llama-server binary (default: on PATH)")
    p.add_argument("--json", default=None, help="also write the rows here")
    args = p.parse_args(argv)
    if min(args.concurrent, args.sequential, args.max_tokens) < 1:
        p.error("--concurrent, --sequential and --max-tokens take 1 or more")
    return args, launch_args


def main(argv: list[str] | None = None) -> list[Footprint]:
    args, launch_args = parse_args(argv)
    binary = find_llama_server(args.llama_server)
    if binary is None:
        raise SystemExit("no llama-server found: bash scripts/build_llama_tools.sh, or pass --llama-server PATH")
    target, draft = (gguf_file(name) for name in launch_pair(launch_args))
    threads = args.threads or os.cpu_count() or 1
    rows = []
    with tempfile.TemporaryDirectory(prefix="speclens-footprint-") as cache_dir:
        for job, n in (("concurrent", args.concurrent), ("sequential", args.sequential)):
            rows.append(app_footprint(job, n, args.max_tokens, Path(cache_dir), launch_args))
            rows.append(peer_footprint(job, n, args.max_tokens, binary, target, draft, threads))
    print(f"{'job':<12}{'answers':>8}{'side':>14}{'RSS MB':>9}{'peak MB':>9}{'x peer':>8}")
    for job in ("concurrent", "sequential"):
        app, peer = (next(r for r in rows if r.job == job and r.side == side) for side in ("app", "llama-server"))
        for row in (app, peer):
            ratio = f"{row.rss_mb / peer.rss_mb:.2f}" if row is app else ""
            print(f"{job:<12}{row.answers:>8}{row.side:>14}{row.rss_mb:>9.0f}{row.peak_mb:>9.0f}{ratio:>8}")
    for row in rows:
        print(f"  {row.side} ({row.job}): {row.command}")
    if args.json:
        Path(args.json).write_text(json.dumps({"launch_args": launch_args, "max_tokens": args.max_tokens,
                                               "rows": [asdict(r) for r in rows]}, indent=1))
    return rows


if __name__ == "__main__":
    main()
