"""Calibrate the paraphrase judge's threshold for one (model, precision): P(Yes) on every labelled pair.

    python -m bench.cache.calibrate --pairs FILE.jsonl[,FILE2] --judge MODEL [--judge-precision P] [--json OUT]

Every pair is judged and its P(Yes) printed; the threshold is proposed from the pairs the app would ask the
judge about (those that only the key-terms guard stops: engine/cache/guards.py ``judge_decides``; a pair
that differs in numbers, negation or order is never served on a judge's word): the lowest one that no such
near-miss reaches, with a margin (0.05). The threshold the app uses per (model, precision) lives in
engine/cache/judge.py ``YES_THRESHOLDS``; measure it there with ``python -m bench.cache.evaluate --judge`` on
pairs the calibration did not see.
"""
from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from tqdm import tqdm

from bench.cache.evaluate import check_judge, load_pairs
from bench.cli import arguments_checked
from engine.cache.guards import judge_decides

MARGIN = 0.05  # above the highest judged near-miss: its P(Yes) is one draw from a spread


def propose(scores: list[tuple[float, bool]]) -> dict:
    """The threshold just above every near-miss (P(Yes) of a "same": false pair), and what it gives; ``scores``:
    (P(Yes), same) of the pairs the judge decides."""
    negatives = [p for p, same in scores if not same]
    positives = [p for p, same in scores if same]
    top_negative = max(negatives, default=0.0)
    threshold = min(0.99, math.ceil(round((top_negative + MARGIN) * 100, 6)) / 100)
    served = [same for p, same in scores if p >= threshold]
    return {"threshold": threshold, "max_negative": top_negative, "min_positive": min(positives, default=None),
            "recall": sum(served) / len(positives) if positives else None,
            "precision": sum(served) / len(served) if served else None}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cache.calibrate", description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", required=True, help="JSONL file(s) of {a, b, same}, comma-separated")
    parser.add_argument("--judge", required=True, metavar="MODEL", help="the judging model (a built-in name)")
    parser.add_argument("--judge-precision", help="its precision (default: auto for this machine)")
    parser.add_argument("--json", help="write every pair's P(Yes) and the proposal here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        pairs = load_pairs(args.pairs)
        check_judge(args)
    from engine.cache.judge import LLMJudge, calibrated_threshold
    from engine.models.loading import load_model, quiet_library_logs

    quiet_library_logs()
    loaded = load_model(args.judge, args.judge_precision, role="target")
    judge, t0 = LLMJudge(loaded, 0.5), time.perf_counter()
    scored = [(judge.probability(p["a"], p["b"]), bool(p["same"])) for p in tqdm(pairs, desc="judge", unit="pair")]
    seconds = time.perf_counter() - t0
    asked = [judge_decides(p["a"], p["b"]) for p in pairs]
    proposal = propose([s for s, judged in zip(scored, asked) if judged])
    print(f"{loaded.name} at {loaded.precision}: {len(pairs)} pairs in {seconds:.0f} s "
          f"({seconds / len(pairs) * 1e3:.0f} ms a pair); now in use: {calibrated_threshold(loaded.name, loaded.precision)}")
    for label, want in (("paraphrases", True), ("near-misses", False)):
        for kind, judged in (("judged in the app", True), ("decided by the guards", False)):
            values = sorted(round(p, 3) for (p, same), j in zip(scored, asked) if same == want and j == judged)
            print(f"  {label:<12} {kind:<22} P(Yes) {values}")
    print(f"proposed threshold {proposal['threshold']:.2f} (highest judged near-miss {proposal['max_negative']:.3f}): "
          f"on the {sum(asked)} judged pairs precision {proposal['precision'] or 0:.2f}, recall {proposal['recall'] or 0:.2f}")
    if args.json:
        rows = [{**p, "p_yes": s, "judged_in_the_app": j} for p, (s, _), j in zip(pairs, scored, asked)]
        Path(args.json).write_text(json.dumps({"model": loaded.name, "precision": loaded.precision,
                                               "pairs": rows, "proposal": proposal}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
