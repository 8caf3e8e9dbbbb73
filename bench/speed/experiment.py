"""Experiment CLI: the Experiments tab's grid without the browser; writes the JSON, CSV and HTML report.

python -m bench.speed.experiment --sets code,prose --ks 2,4,8 --temperatures 0,0.7,1 [--proposers draft]
                           [--target NAME] [--draft NAME] [--dtype auto] [--draft-dtype auto]
                           [--prompts-per-set 2] [--max-new-tokens 48] [--seed 0] [--doctor] --out DIR
python -m bench.speed.experiment --rerun DIR/experiment.json --out DIR2   # the same grid again, compared

Before the run it prints how long the grid should take at the target-only speed the app measured on this machine
(none measured yet: it says so). Ctrl-C (or SIGTERM) stops the run like the tab's Stop button and still saves the
finished cells.
A rerun says whether the token ids (greedy cells) and accept counts (seeded sampling, fixed k) match the saved run.
"""
from __future__ import annotations

import argparse
import signal
import sys
import threading

from tqdm.auto import tqdm

from app.baseline import BaselineStore, grid_estimate
from app.views.report.files import load_result, save_result
from engine.chat_engine import ChatEngine
from engine.surface import EngineSurface
from engine.errors import EngineError
from engine.lab.grid import ADAPTIVE, ExperimentGrid, parse_ks, parse_names, parse_temperatures
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.loading import quiet_library_logs


def grid_from_args(args: argparse.Namespace) -> ExperimentGrid:
    return ExperimentGrid(sets=parse_names(args.sets, "prompt sets"), ks=parse_ks(args.ks),
                          temperatures=parse_temperatures(args.temperatures),
                          proposers=parse_names(args.proposers, "proposers"), drafts=(args.draft,),
                          draft_precisions=(args.draft_dtype,), target_precisions=(args.dtype,), target=args.target,
                          prompts_per_set=args.prompts_per_set, max_new_tokens=args.max_new_tokens, seed=args.seed)


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'set':<15} {'k':>8} {'T':>4} {'proposer':<8} {'tok/s':>6} {'base':>6} {'speedup':>7} {'pred.':>6} "
             f"{'accept':>6} {'alpha':>5} {'m.acc':>5} {'same':>5} {'dist p':>6}"]
    for r in rows:
        p = "" if r["distribution_p"] is None else f"{r['distribution_p']:.2f}"
        pred = "" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}"
        lines.append(f"{r['prompt_set']:<15} {str(r['k']):>8} {r['temperature']:>4g} {r['proposer']:<8} "
                     f"{r['tokens_per_s']:>6.2f} {r['baseline_tokens_per_s']:>6.2f} {r['speedup']:>7.2f} {pred:>6} "
                     f"{r['acceptance']:>6.2f} {r['alpha']:>5.2f} {r['mean_accepted']:>5.2f} {r['identical'] or '':>5} "
                     f"{p:>6}")
    return "\n".join(lines)


def compare(saved: dict, new: dict) -> list[str]:
    """What differs between two runs of one grid (empty: reproduced)."""
    problems = []
    old_rows = {r["cell"]: r for r in saved["rows"]}
    for r in new["rows"]:
        old = old_rows.get(r["cell"])
        if old is None:
            continue
        if r["temperature"] == 0 and r["token_ids"] != old["token_ids"]:
            problems.append(f"{r['cell']}: greedy token ids differ")
        if r["temperature"] > 0 and r["k"] != ADAPTIVE and r["accepted_counts"] != old["accepted_counts"]:
            problems.append(f"{r['cell']}: accept counts differ ({old['accepted_counts']} -> {r['accepted_counts']})")
    return problems


def stop_on_signals() -> threading.Event:
    """Ctrl-C or SIGTERM acts as the tab's Stop: the current generation ends at its next step and the finished
    cells are saved."""
    cancel = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: cancel.set())
    return cancel


def run(engine: EngineSurface, grid: ExperimentGrid, doctor: bool) -> dict:
    cancel = stop_on_signals()
    report = engine.pair_doctor(grid.sets, 24, cancel) if doctor else None
    result = None
    with tqdm(total=None, desc="experiment", unit="gen") as bar:
        for update in engine.run_experiment(grid, cancel):
            bar.total = update.total
            bar.n = update.done
            bar.set_postfix_str(update.message[:60])
            bar.refresh()
            if update.row is not None:
                tqdm.write(f"done: {update.row['cell']}  speedup {update.row['speedup']:.2f}", file=sys.stderr)
            result = update.result or result
    if report is not None:
        result["doctor"] = report.to_dict()
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.experiment", description=__doc__.splitlines()[0])
    parser.add_argument("--sets", default="code,prose", help="built-in prompt sets: code, edit, prose, math, "
                                                             "low-acceptance")
    parser.add_argument("--ks", default="2,4,8", help="draft lengths, and/or 'adaptive'")
    parser.add_argument("--temperatures", default="0,0.7,1.0")
    parser.add_argument("--proposers", default="draft", help="draft, lookup, hybrid")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--dtype", default="auto", help="target precision")
    parser.add_argument("--draft-dtype", default="auto", help="draft precision")
    parser.add_argument("--prompts-per-set", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--doctor", action="store_true", help="run the pair doctor first (its probe per set)")
    parser.add_argument("--rerun", help="a saved experiment JSON: run its grid again and compare")
    parser.add_argument("--out", required=True, help="folder for experiment.json/.csv/.html")
    args = parser.parse_args(argv)
    quiet_library_logs()
    try:
        saved = load_result(args.rerun) if args.rerun else None
        grid = ExperimentGrid.from_dict(saved["grid"]) if saved else grid_from_args(args)
        engine = ChatEngine(measure_beside=False)
        info = engine.load_pair(grid.target, grid.drafts[0], grid.target_precisions[0], grid.draft_precisions[0])
        print(f"target {info.target} ({info.target_precision}), draft {info.draft} ({info.draft_precision}); "
              f"{len(grid.cells())} cells", flush=True)
        print(f"estimate: {grid_estimate(BaselineStore(), grid, info)[1]}", flush=True)
        result = run(engine, grid, args.doctor)
    except EngineError as err:
        sys.exit(f"error: {err}")
    paths = save_result(result, args.out)
    print(format_rows(result["rows"]))
    print("\n".join(f"{kind}: {path}" for kind, path in paths.items()))
    if saved is not None:
        problems = compare(saved, result)
        print("reproduced: same greedy token ids and seeded accept counts" if not problems else "\n".join(problems))
        if problems:
            sys.exit(1)


if __name__ == "__main__":
    main()
