"""Serving bench: what a user gets where a user gets it, interleaved per prompt in one run.

python -m bench.speed.serving --prompts bench/prompts/eval.jsonl [--max-new-tokens 96]
                              [--modes browser,v1,engine,llama-server,floor,floor-v1] [--target NAME] [--draft NAME]
                              [--app-dir DIR] [--cache-dir DIR] [--llama-server PATH] [--threads N]
                              [--verify-mode identical|fastest] [--json OUT] [--profile DIR]

One conversation: every prompt of the file is sent after the ones before it, with their answers as its history,
to four paths, in an order rotated per prompt:
- ``browser``: the app's Chat tab in headless Chromium (Playwright, Debian's /usr/bin/chromium), on the same cores
  as the app, as a local user has it; its clock runs in the page, from the click to the last token drawn;
- ``v1``: the app's ``/v1/chat/completions``, streamed;
- ``engine``: the same engine in this process (``ChatEngine.generate``, the default spec, no cache);
- ``llama-server``: llama.cpp's ``/v1/completions`` on the same GGUF with the same prompt tokens, streamed;
- ``floor`` (with ``browser``): a plain Gradio chat page with no model (bench/speed/serving_floor.py) in the same
  Chromium, streaming as many coloured spans as the browser's answer had at its decode rate, after the others: what a
  chat page must cost Chromium, the bar for the app's page;
- ``floor-v1`` (with ``browser`` and ``v1``): ``v1``'s answer again while that plain page streams as many spans at
  ``v1``'s decode rate beside it, after the others: what a page that costs what plain Gradio costs leaves of the
  app's speed, the bar for ``browser`` (it asks as an OpenAI ``user`` of its own, like ``v1``).

The app is ``launch.py --no-semantic-cache`` (from ``--app-dir``, this checkout by default) on a free port, with the
pair of ``--target`` and ``--draft`` (the default pair), as is the engine in this process; llama-server runs the
target's GGUF file. Every run starts from the state a chat's next turn finds: the conversation so far is in the path's
KV cache and the new message is not. The browser's chat goes on with the answers it holds, which the app's pool of
contexts keeps for its next turn whatever ran in between (a runner takes the context its prompt goes on from);
every other run is preceded by an untimed one-token request of the history and another message on the same path,
its history going on with the app's own answer (``v1``'s, else the engine's or llama-server's). ``v1`` asks as its
own OpenAI ``user``, so neither of the app's paths drafts from the other's answer to the same message (the app's
memory of earlier answers is per user). Each run records tokens, seconds, the time to the first token and the
decode rate; the browser's also the panel's tokens/s, and every app run the CPU seconds the app (and for the
browser, Chromium) took meanwhile, and for a page (browser, floor) Chromium's own clocks of its main thread (CDP
``Performance.getMetrics``: script, style, layout and all its tasks) and its DOM nodes. The summary prints the ratios
the issue asks for and the pages' main-thread ms per token on the first and the last answer; ``--profile DIR`` also
records the pages' JavaScript CPU profiles on those two answers.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

from tqdm.auto import tqdm

from bench.cli import arguments_checked, read_jsonl
from bench.speed.page_clock import PAGE_METRICS, profile_top
from bench.speed.serving_browser import CHROMIUM
from bench.speed.serving_paths import Paths
from engine.config import VERIFY_MODES
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

ROOT = Path(__file__).resolve().parents[2]
MODES = ("browser", "v1", "engine", "llama-server", "floor", "floor-v1")


def run_bench(paths: Paths, prompts: list[dict], modes: list[str], profile_dir: Path | None = None) -> list[dict]:
    """Every prompt through every mode (the order rotated per prompt), one conversation; with ``profile_dir``, the
    pages' JavaScript CPU profiles of the first and the last answer are written there (``.cpuprofile``, for
    DevTools' Performance panel) and their top functions kept in the runs."""
    runs, history = [], []  # the conversation so far
    rotated = [m for m in modes if m not in ("floor", "floor-v1")]
    with tqdm(total=len(prompts) * len(modes), desc="serving", unit="run") as bar:
        for i, item in enumerate(prompts):
            question = {"role": "user", "content": item["prompt"]}
            messages = [*history, question]
            texts, done = {}, {}
            profile = profile_dir is not None and i in (0, len(prompts) - 1)
            for mode in rotated[i % len(rotated):] + rotated[:i % len(rotated)]:
                bar.set_postfix_str(f"{item['id']} / {mode}")
                if mode != "browser":  # the chat's own context holds its conversation, kept by the app's pool
                    paths.prime(mode, history)
                run = paths.run(mode, messages, profile)
                texts[mode] = run.pop("text", None)
                done[mode] = run = {"id": item["id"], "kind": item.get("kind", ""), "turn": i, "mode": mode,
                                    **_kept_profile(run, profile_dir, f"{mode}-answer{i + 1}")}
                runs.append(run)
                bar.update()
            if "floor" in modes:  # the browser's answer again, as spans of a plain page at the same rate
                seen = done["browser"]
                run = paths.floor_run(seen["tokens"], seen["decode_tokens_per_s"] or 15.0, profile)
                runs.append({"id": item["id"], "kind": item.get("kind", ""), "turn": i, "mode": "floor",
                             **_kept_profile(run, profile_dir, f"floor-answer{i + 1}")})
                bar.update()
            if "floor-v1" in modes:  # v1's answer again, with the plain page drawing it beside (its own memory scope)
                alone = done["v1"]
                paths.prime("floor-v1", history)
                run = paths.beside_floor_run(messages, alone["tokens"], alone["decode_tokens_per_s"] or 15.0,
                                             alone["ttft_s"] or 0.0)
                run.pop("text", None)  # the history goes on with v1's own answer
                runs.append({"id": item["id"], "kind": item.get("kind", ""), "turn": i, "mode": "floor-v1", **run})
                bar.update()
            # the history goes on with the app's own answer (v1's, else the engine's or llama-server's); the browser
            # chat goes on with its own, in the page
            answer = next((texts[m] for m in ("v1", "engine", "llama-server") if texts.get(m) is not None), "")
            history = [*messages, {"role": "assistant", "content": answer}]
    return runs


def _kept_profile(run: dict, profile_dir: Path | None, name: str) -> dict:
    """The run with its page's CPU profile written to ``profile_dir/name.cpuprofile`` and its top functions kept."""
    profile = run.pop("page_profile", None)
    if profile is None:
        return run
    path = profile_dir / f"{name}.cpuprofile"
    path.write_text(json.dumps(profile))
    return {**run, "page_profile_file": str(path), "page_profile_top": profile_top(profile)}


def page_cost_rows(runs: list[dict]) -> list[dict]:
    """Per page run (browser, floor): what each token cost the page's main thread, in ms, by kind."""
    rows = []
    for r in runs:
        if "page_task_s" in r and r["tokens"]:
            rows.append({"turn": r["turn"], "mode": r["mode"], "nodes": r["page_nodes"],
                         **{k: 1e3 * r[f"page_{k}_s"] / r["tokens"] for k in PAGE_METRICS}})
    return rows


def format_page_costs(runs: list[dict]) -> str:
    """The page's main-thread ms per token by kind, first and last answer of each page (Chromium's own clocks)."""
    rows = page_cost_rows(runs)
    if not rows:
        return ""
    lines = ["| page, answer | " + " | ".join(f"{k} ms/token" for k in PAGE_METRICS) + " | DOM nodes |",
             "| --- |" + " --- |" * (len(PAGE_METRICS) + 1)]
    last = max(r["turn"] for r in rows)
    for r in rows:
        if r["turn"] in (0, last):
            lines.append(f"| {r['mode']}, {r['turn'] + 1} | " + " | ".join(f"{r[k]:.1f}" for k in PAGE_METRICS)
                         + f" | {r['nodes']} |")
    return "\n".join(lines)


def _rate(runs: list[dict]) -> float:
    return sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)


def summarize(runs: list[dict], modes: list[str]) -> dict:
    by_mode = {m: [r for r in runs if r["mode"] == m] for m in modes}
    table = {}
    for mode, rs in by_mode.items():
        decode = [r["decode_tokens_per_s"] for r in rs if r.get("decode_tokens_per_s")]
        ttft = [r["ttft_s"] for r in rs if r.get("ttft_s") is not None]
        table[mode] = {"tokens_per_s": _rate(rs), "decode_tokens_per_s": statistics.median(decode) if decode else None,
                       "ttft_median_s": statistics.median(ttft) if ttft else None,
                       "app_cpu_s_per_token": (sum(r["app_cpu_s"] for r in rs) / sum(r["tokens"] for r in rs))
                       if rs and "app_cpu_s" in rs[0] else None,
                       "browser_cpu_s_per_token": (sum(r["browser_cpu_s"] for r in rs) / sum(r["tokens"] for r in rs))
                       if rs and "browser_cpu_s" in rs[0] else None}
    ratios = {}

    def ratio(name: str, a: str, b: str, field: str = "tokens_per_s"):
        if a in table and b in table and table[a][field] and table[b][field]:
            ratios[name] = table[a][field] / table[b][field]

    ratio("browser / v1", "browser", "v1")
    ratio("v1 / engine", "v1", "engine")
    ratio("v1 / llama-server", "v1", "llama-server")
    ratio("engine / llama-server", "engine", "llama-server")
    ratio("v1 TTFT / llama-server TTFT", "v1", "llama-server", "ttft_median_s")
    # what a page that costs what plain Gradio costs leaves of /v1's speed, and the app's page against that
    ratio("v1 beside the floor page / v1", "floor-v1", "v1")
    ratio("browser / v1 beside the floor page", "browser", "floor-v1")
    ratio("browser / v1 beside the floor page (decode)", "browser", "floor-v1", "decode_tokens_per_s")
    browser = by_mode.get("browser") or []
    floor = by_mode.get("floor") or []
    for name, index in (("first", 0), ("last", -1)):
        if browser and floor and floor[index]["browser_cpu_s"] > 0:
            ratios[f"Chromium CPU/token browser / floor, {name} answer"] = (
                browser[index]["browser_cpu_s"] / browser[index]["tokens"]) / (
                floor[index]["browser_cpu_s"] / floor[index]["tokens"])
    if len(browser) >= 2 and browser[0].get("decode_tokens_per_s") and browser[-1].get("decode_tokens_per_s"):
        ratios["browser last / first (decode)"] = browser[-1]["decode_tokens_per_s"] / browser[0]["decode_tokens_per_s"]
    panel = [r["panel_tokens_per_s"] / (r["tokens"] / r["seconds"]) for r in browser if r["seconds"] > 0]
    if panel:
        ratios["panel / browser-seen tok/s (worst)"] = max(panel, key=lambda x: abs(x - 1))
    return {"modes": table, "ratios": ratios}


def format_summary(summary: dict) -> str:
    lines = ["| path | tok/s | decode tok/s (median) | TTFT median | app CPU ms/token | Chromium CPU ms/token |",
             "| --- | --- | --- | --- | --- | --- |"]
    ms = lambda x: "–" if x is None else f"{x * 1e3:.1f}"  # noqa: E731
    for mode, row in summary["modes"].items():
        decode = "–" if row["decode_tokens_per_s"] is None else f"{row['decode_tokens_per_s']:.2f}"
        ttft = "–" if row["ttft_median_s"] is None else f"{row['ttft_median_s']:.2f} s"
        lines.append(f"| {mode} | {row['tokens_per_s']:.2f} | {decode} | {ttft} | {ms(row['app_cpu_s_per_token'])} "
                     f"| {ms(row['browser_cpu_s_per_token'])} |")
    lines += ["", *(f"- {name}: {value:.2f}×" if "TTFT" not in name and "panel" not in name and "CPU" not in name else
                    f"- {name}: {value:.2f}" for name, value in summary["ratios"].items())]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.serving", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True, help="JSONL with {id, kind, prompt} per line")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--modes", default=",".join(MODES), help=f"a comma list of {', '.join(MODES)}")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--app-dir", default=str(ROOT), help="the checkout whose launch.py serves the app")
    parser.add_argument("--cache-dir", default=None, help="the app's --cache-dir (default: the app's default)")
    parser.add_argument("--llama-server", default=None, help="llama-server binary (default: PATH, then the peer extra)")
    parser.add_argument("--threads", type=int, default=None, help="llama-server's threads (default: the engine's)")
    parser.add_argument("--verify-mode", choices=VERIFY_MODES, default=None,
                        help="the app's and the engine's verify mode, as the model panel sets it (fastest also runs a "
                             "llama.cpp target with llama-server's settings; default: the one measured at load)")
    parser.add_argument("--json", help="write the runs and the summary here")
    parser.add_argument("--profile", metavar="DIR", help="write the pages' JavaScript CPU profiles of the first and the "
                                                         "last answer here (.cpuprofile) and keep their top functions")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        unknown = [m for m in modes if m not in MODES]
        if unknown or not modes:
            raise ValueError(f"--modes: {', '.join(unknown) or 'none given'}; choose from {', '.join(MODES)}")
        if args.max_new_tokens < 1:
            raise ValueError("--max-new-tokens must be at least 1")
        prompts = read_jsonl(args.prompts, ("id", "prompt"))
        if "floor" in modes and "browser" not in modes:
            raise ValueError("mode floor streams the browser's answers again: give browser too")
        if "floor-v1" in modes and not {"browser", "v1"} <= set(modes):
            raise ValueError("mode floor-v1 runs v1's answers again beside the floor page in the browser's "
                             "Chromium: give browser and v1 too")
        if "browser" in modes and not os.path.exists(CHROMIUM):
            raise ValueError(f"mode browser needs Debian's Chromium at {CHROMIUM} (apt-get install chromium)")
    with ExitStack() as stack:
        paths = Paths(stack, args, modes)
        info = paths.engine.info()
        print(f"[serving] {os.cpu_count()} cores; app {paths.url}; modes {', '.join(modes)}; verify mode "
              f"{info.verify_mode or '(no choice)'}; target: {info.runner}", flush=True)
        profile_dir = None
        if args.profile:
            profile_dir = Path(args.profile)
            profile_dir.mkdir(parents=True, exist_ok=True)
        runs = run_bench(paths, prompts, modes, profile_dir)
    summary = summarize(runs, modes)
    print(format_summary(summary))
    print(format_page_costs(runs))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        setup = {"verify_mode": info.verify_mode, "target_runner": info.runner}
        Path(args.json).write_text(json.dumps({"runs": runs, "summary": summary, "setup": setup}, indent=1))


if __name__ == "__main__":
    main()
