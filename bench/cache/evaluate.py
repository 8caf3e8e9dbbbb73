"""Evaluate the semantic cache on labelled prompt pairs, and measure its lookup latency.

    python -m bench.cache.evaluate --pairs FILE.jsonl [--json OUT] [--threshold X] [--cache-url URL] [--judge MODEL]
    python -m bench.cache.evaluate --latency [--entries 10000] [--cache-url URL]
    python -m bench.cache.evaluate --exactness --pairs FILE.jsonl --cache-url URL [--distractors N] [--ef 50,200]

FILE.jsonl holds {"a": ..., "b": ..., "same": bool} per line. For each pair a fresh cache stores ``a`` and
looks up ``b`` in ``direct`` mode. "Served" means answered without verification (exact or cached); the
raw-cosine columns show what serving every hit above the threshold would give. ``--cache-url`` runs the
same evaluation on a Redis store (one throw-away namespace per pair, cleared afterwards); ``--judge`` loads a
model (e.g. qwen2.5-coder-0.5b-instruct) as the paraphrase judge and reports its latency per judged hit.
``--latency`` and ``--exactness``: see :mod:`bench.cache.scale`.
"""
from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from contextlib import contextmanager
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from bench.cli import arguments_checked, read_jsonl, whole_number_at_least
from engine.config import DEFAULT_CACHE_THRESHOLD, CacheConfig, SamplingConfig
from engine.cache.stores import StoreUnavailable, is_url, open_store
from bench.cache.scale import format_exactness, format_latency, measure_exactness, measure_latency
from engine.cache.embedder import load_default_embedder, normalise_rows
from engine.cache.records import mask_url
from engine.cache.semantic_cache import OUTCOMES, SemanticCache, make_scope

EVAL_SCOPE = make_scope("eval-target", "bf16", SamplingConfig(), "", [])
PLACEHOLDER = "<cached answer>"


def load_pairs(paths: str) -> list[dict]:
    """The labelled pairs of one JSONL file, or of several named comma-separated, in order."""
    return [p for path in paths.split(",") for p in read_jsonl(path, ("a", "b", "same"))]


def precision_recall(predicted: list[bool], truth: list[bool]) -> tuple[float | None, float | None]:
    tp = sum(p and t for p, t in zip(predicted, truth))
    n_pred, n_true = sum(predicted), sum(truth)
    return (tp / n_pred if n_pred else None), (tp / n_true if n_true else None)


class MemoEmbedder:
    """Encodes all texts once, in one batch; the per-pair caches then reuse the vectors."""

    def __init__(self, embedder, texts: list[str]):
        unique = list(dict.fromkeys(texts))
        self._vecs = dict(zip(unique, normalise_rows(embedder.encode(unique))))
        self._embedder = embedder

    def encode(self, texts: list[str]):
        missing = [t for t in texts if t not in self._vecs]
        if missing:
            self._vecs.update(zip(missing, normalise_rows(self._embedder.encode(missing))))
        return normalise_rows([self._vecs[t] for t in texts])


@contextmanager
def fresh_stores(cache_url: str | None):
    """``make(name) -> store``: a new empty store per call, in a temp directory or a throw-away Redis namespace."""
    made = []
    with tempfile.TemporaryDirectory() as tmp:
        run = uuid.uuid4().hex[:8]

        def make(name: str):
            store = open_store(cache_url, namespace=f"speclens-eval-{run}-{name}") if cache_url \
                else open_store(Path(tmp) / name)
            made.append(store)
            return store
        try:
            yield make
        finally:
            for store in made:
                if cache_url:
                    store.drop()
                store.close()


class TimedJudge:
    """Wraps a judge callable and records how long each call took."""

    def __init__(self, judge):
        self.judge, self.seconds = judge, []

    def __call__(self, a: str, b: str) -> bool:
        t0 = time.perf_counter()
        try:
            return self.judge(a, b)
        finally:
            self.seconds.append(time.perf_counter() - t0)


def evaluate_pairs(pairs: list[dict], embedder, threshold: float = DEFAULT_CACHE_THRESHOLD, progress: bool = True,
                   cache_url: str | None = None, judge=None) -> dict:
    rows = []
    embedder = MemoEmbedder(embedder, [p[k] for p in pairs for k in ("a", "b")])
    timed = TimedJudge(judge) if judge is not None else None
    with fresh_stores(cache_url) as make:
        for i, pair in enumerate(tqdm(pairs, desc="pairs", disable=not progress)):
            cache = SemanticCache(make(str(i)), embedder, config=CacheConfig("direct", threshold))
            if cache.problem:
                raise RuntimeError(f"cache store unavailable: {cache.problem}")
            cache.store(pair["a"], EVAL_SCOPE, PLACEHOLDER, [0], complete=True)
            hit = cache.lookup(pair["b"], EVAL_SCOPE, judge=timed)
            va, vb = normalise_rows(embedder.encode([pair["a"], pair["b"]]))
            rows.append({"a": pair["a"], "b": pair["b"], "same": bool(pair["same"]), "outcome": hit.outcome,
                         "cosine": round(float(va @ vb), 4), "reason": hit.reason})
    report = summarise(rows, threshold)
    report["backend"] = "redis" if cache_url else "disk"
    if timed is not None:
        report["judge_calls"] = len(timed.seconds)
        report["judge_median_ms"] = statistics.median(timed.seconds) * 1e3 if timed.seconds else None
    return report


def summarise(rows: list[dict], threshold: float) -> dict:
    truth = [r["same"] for r in rows]
    served = [r["outcome"] in ("exact", "cached") for r in rows]
    raw = [r["cosine"] >= threshold for r in rows]
    sp, sr = precision_recall(served, truth)
    rp, rr = precision_recall(raw, truth)
    return {
        "threshold": threshold, "pairs": len(rows), "same_pairs": sum(truth),
        "served_precision": sp, "served_recall": sr, "served": sum(served),
        "false_served": sum(s and not t for s, t in zip(served, truth)),
        "outcomes": {o: Counter(r["outcome"] for r in rows)[o] for o in OUTCOMES},
        "raw_cosine_precision": rp, "raw_cosine_recall": rr, "rows": rows,
    }


def _pct(x: float | None) -> str:
    return "  n/a" if x is None else f"{x:5.2f}"


def format_report(report: dict) -> str:
    lines = [f"{'same':>5} {'cos':>5} {'outcome':>9}  pair / reason", "-" * 100]
    for r in report["rows"]:
        mark = " !" if r["outcome"] in ("exact", "cached") and not r["same"] else ""
        lines.append(f"{str(r['same']):>5} {r['cosine']:5.3f} {r['outcome']:>9}{mark:2} {r['a']} | {r['b']}")
        if r["reason"]:
            lines.append(f"{'':24}-> {r['reason']}")
    o = report["outcomes"]
    judged = ""
    if report.get("judge_calls") is not None:
        ms = report["judge_median_ms"]
        judged = f", judge called {report['judge_calls']}x" + (f" (median {ms:.0f} ms)" if ms is not None else "")
    served_label = "served (guards+judge)" if judged else "served (guards)"
    lines += ["-" * 100,
              f"pairs {report['pairs']} (same {report['same_pairs']}), threshold {report['threshold']:.2f}, "
              f"backend {report.get('backend', 'disk')}{judged}",
              f"outcomes: exact {o['exact']}  cached {o['cached']}  verified {o['verified']}  miss {o['miss']}",
              f"{'':22}{'precision':>10} {'recall':>7}",
              f"{served_label:22}{_pct(report['served_precision']):>10} {_pct(report['served_recall']):>7}"
              f"   ({report['served']} served, {report['false_served']} wrong)",
              f"{'raw cosine >= thr':22}{_pct(report['raw_cosine_precision']):>10}"
              f" {_pct(report['raw_cosine_recall']):>7}"]
    return "\n".join(lines)


def check_cache_url(url: str) -> None:
    """A Redis URL that answers now; ValueError (InvalidSettingError for a malformed URL) says why not, the
    password masked."""
    if not is_url(url):
        raise ValueError(f"--cache-url: expected redis://, rediss:// or unix://, got {mask_url(url)}")
    store = open_store(url, namespace="speclens-eval-probe")
    try:
        store.count()
    except StoreUnavailable as err:
        cause = err.__cause__ or err
        raise ValueError(f"--cache-url {mask_url(url)}: Redis cannot be used ({type(cause).__name__}: "
                         f"{cause})") from None
    finally:
        store.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cache.evaluate", description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", help="JSONL file(s) of {a, b, same}, comma-separated")
    parser.add_argument("--json", help="write the full report here")
    parser.add_argument("--threshold", type=float, default=DEFAULT_CACHE_THRESHOLD)
    parser.add_argument("--latency", action="store_true", help="measure lookup latency")
    parser.add_argument("--entries", type=whole_number_at_least(1), default=10_000, help="cache size for --latency")
    parser.add_argument("--exactness", action="store_true",
                        help="with --pairs and --cache-url: outcomes of the server search against the exact scan")
    parser.add_argument("--distractors", type=int, default=100_000, help="other entries for --exactness")
    parser.add_argument("--ef", default="10,20,50,100,200", help="comma-separated EF values for --exactness")
    parser.add_argument("--build-ef", type=int, help="vector-set insert EF of the filled store (default: the app's)")
    parser.add_argument("--namespace", help="--latency, --exactness: fill (or resume filling) this Redis namespace "
                                            "and keep it; --exactness then uses its entries as the distractors")
    parser.add_argument("--cache-url", help="run against Redis (redis://[:password@]host:port/db) instead of disk")
    parser.add_argument("--judge", metavar="MODEL", help="paraphrase judge model for direct mode (a built-in name)")
    parser.add_argument("--judge-threshold", type=float, help="P(yes) the judge needs (default: its calibrated one)")
    parser.add_argument("--judge-precision", help="the judge model's precision (default: auto for this machine)")
    return parser


def checked_pairs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[dict] | None:
    """Every argument checked before anything loads (a bad one exits through ``parser``); the pairs of
    ``--pairs``, or None without it."""
    if not args.pairs and not args.latency:
        parser.error("give --pairs FILE.jsonl and/or --latency")
    with arguments_checked(parser):
        CacheConfig(mode="direct", threshold=args.threshold)
        pairs = load_pairs(args.pairs) if args.pairs else None
        if args.judge:
            check_judge(args)
        if args.exactness and not (args.pairs and args.cache_url):
            raise ValueError("--exactness needs --pairs and --cache-url")
        if args.cache_url:
            check_cache_url(args.cache_url)
    return pairs


def load_judge(parser: argparse.ArgumentParser, args: argparse.Namespace):
    """The ``--judge`` model as an LLMJudge at its threshold (calibrated, or ``--judge-threshold``); None
    without ``--judge``. A model with no calibrated threshold and none given exits through ``parser``."""
    if not args.judge:
        return None
    from engine.cache.judge import LLMJudge, calibrated_threshold
    from engine.models.loading import load_model, quiet_library_logs

    quiet_library_logs()
    loaded = load_model(args.judge, args.judge_precision, role="target")
    threshold = args.judge_threshold if args.judge_threshold is not None \
        else calibrated_threshold(loaded.name, loaded.precision)
    if threshold is None:
        parser.error(f"{args.judge} at {loaded.precision} has no calibrated judge threshold: "
                     "give --judge-threshold (or --judge-precision)")
    return LLMJudge(loaded, threshold)


def pairs_report(args: argparse.Namespace, pairs: list[dict], judge) -> dict:
    """``{"exactness": ...}`` with ``--exactness``, else ``{"pairs": ...}``; printed as it is made."""
    if args.exactness:
        memo = MemoEmbedder(load_default_embedder(), [p[k] for p in pairs for k in ("a", "b")])
        exactness = measure_exactness(pairs, memo, args.cache_url, args.distractors,
                                      [int(x) for x in args.ef.split(",")], judge, build_ef=args.build_ef,
                                      namespace=args.namespace)
        print(format_exactness(exactness))
        return {"exactness": exactness}
    report = evaluate_pairs(pairs, load_default_embedder(), args.threshold, cache_url=args.cache_url, judge=judge)
    print(format_report(report))
    return {"pairs": report}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    pairs = checked_pairs(parser, args)
    report = {}
    if pairs is not None:
        report.update(pairs_report(args, pairs, load_judge(parser, args)))
    if args.latency:
        report["latency"] = measure_latency(args.entries, cache_url=args.cache_url, build_ef=args.build_ef,
                                            namespace=args.namespace)
        print(format_latency(report["latency"]))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


def check_judge(args) -> None:
    """The judge model's name and precision, checked before anything loads (its threshold: at load)."""
    from engine.config import check_precision
    from engine.models.sources import check_source

    check_source(args.judge)
    if args.judge_precision:
        check_precision(args.judge_precision)


if __name__ == "__main__":
    raise SystemExit(main())
