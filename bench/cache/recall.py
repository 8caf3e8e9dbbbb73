"""The semantic cache's server search among many real-text entries: does it find what an exact scan finds?

    python -m bench.cache.recall --cache-url redis://127.0.0.1:16399/0 --distractors 1000000 \\
        --pairs tests/data/paraphrases.jsonl,tests/data/paraphrases_heldout.jsonl,... [--ef 100,200,400] \\
        [--build-ef 100] [--links 16] [--quantization q8] [--namespace NS] [--corpus out/corpus.npz]

The distractors are real text in prompt-sized pieces, embedded by the app's MiniLM (bench/cache/corpus.py), all in
the one scope the labelled pairs' ``a`` prompts are stored in, as one deployment's entries would be. Then:

- **self-recall**: a query equal to a stored vector finds its entry among the neighbours the app asks the server
  for (engine/cache/search.py ``SERVER_COUNT``), on a fixed sample of the stored entries;
- **agreement**: each pair's ``b`` looked up in direct mode through the server search gives the outcome and the
  matched prompt of the exact in-memory scan over the same store;
- lookup p50 / p99 of the pairs' ``b`` and of pieces not stored (the search and the records it reads; the query's
  embedding, ~5 ms, is not counted), the Redis server's memory and an app instance's RSS on the empty and the
  full store.

Redis 8 (vector sets) only: an older server searches in each instance's memory, exactly.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from bench.cache.corpus import embedded_corpus
from bench.cache.evaluate import check_cache_url, load_pairs
from bench.cache.scale import BATCH, SCOPE, _in_child, redis_memory, scratch
from bench.cli import arguments_checked
from engine.cache.records import CacheRecord
from engine.cache.redis_store import RedisStore
from engine.cache.redis_vectors import BUILD_EF, LINKS, QUANTISATIONS, VectorSettings
from engine.cache.search import SERVER_COUNT, SERVER_EF
from engine.cache.semantic_cache import SemanticCache, entry_key
from engine.config import CacheConfig

SAMPLE = 1000  # stored entries whose own vector is looked up (self-recall)
MISSES = 300  # pieces not stored, looked up: the latency of a new prompt (most are misses)


class KnownEmbedder:
    """The corpus's and the pairs' vectors, looked up by text: lookups are timed without the embedder."""

    def __init__(self, vectors: dict[str, np.ndarray]):
        self._vecs, self.dim = vectors, len(next(iter(vectors.values())))

    def encode(self, texts: list[str]) -> np.ndarray:
        return np.stack([self._vecs[t] for t in texts])


def _bulk(url: str, namespace: str, settings: VectorSettings) -> RedisStore:
    return RedisStore(url, namespace=namespace, max_entries=10**9, timeout_s=60, vectors=settings)


_worker = None


def _fill_batch(job) -> int:
    global _worker
    url, namespace, settings, texts, vectors = job
    _worker = _worker or _bulk(url, namespace, settings)
    _worker.put_many([(entry_key(SCOPE, t), CacheRecord.new(t, SCOPE, "a cached answer", [0], v, 0.0).to_json())
                      for t, v in zip(texts, vectors)], None, atomic=False)
    return len(texts)


def fill(url: str, namespace: str, settings: VectorSettings, texts: list[str], vectors: np.ndarray,
         workers: int = 2) -> float:
    """Store every piece (batches whose last entry is there already are skipped: a fill resumes); entries/s."""
    import redis

    starts = list(range(0, len(texts), BATCH))
    client = redis.Redis.from_url(url)
    with client.pipeline(transaction=False) as p:
        for s in starts:
            p.exists(f"{namespace}:e:{entry_key(SCOPE, texts[min(s + BATCH, len(texts)) - 1])}")
        there = p.execute()
    jobs = [(url, namespace, settings, texts[s:s + BATCH], vectors[s:s + BATCH])
            for s, done in zip(starts, there) if not done]
    written, t0 = sum(len(j[3]) for j in jobs), time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(workers) as pool, \
            tqdm(total=written, desc="fill", unit="entry", smoothing=0.05) as bar:
        for n in pool.imap_unordered(_fill_batch, jobs):
            bar.update(n)
    return written / (time.perf_counter() - t0) if written else 0.0


def _timed(fn, items) -> tuple[list, tuple[float, float]]:
    out, times = [], []
    for item in items:
        t0 = time.perf_counter()
        out.append(fn(item))
        times.append(time.perf_counter() - t0)
    p50, p99 = np.percentile(np.array(times) * 1e3, [50, 99])
    return out, (float(p50), float(p99))


def measure(url: str, pairs: list[dict], texts: list[str], vectors: np.ndarray, misses: list[str],
            embedder: KnownEmbedder, settings: VectorSettings, efs: list[int], namespace: str | None = None) -> dict:
    out = {"entries": len(texts), "settings": vars(settings), "pairs": len(pairs), "by_ef": {}}
    with scratch(url) as (_, empty_ns):
        out["rss_empty_mb"] = _in_child(url, empty_ns, SCOPE, 0, 50)["rss_mb"]
    with scratch(url, namespace) as (_, ns):
        out["insert_per_s"] = fill(url, ns, settings, texts, vectors)
        store = _bulk(url, ns, settings)
        writer = SemanticCache(store, embedder, config=CacheConfig("direct"))
        for p in pairs:
            writer.store(p["a"], SCOPE, "<cached answer>", [0], complete=True)
        out["search"], out["redis_memory"] = writer.search, redis_memory(url)
        out["rss_full_mb"] = _in_child(url, ns, SCOPE, 0, 50)["rss_mb"]
        exact = SemanticCache(store, embedder, config=CacheConfig("direct"), search="memory")
        want = [exact.lookup(p["b"], SCOPE) for p in pairs]
        out["exact_outcomes"] = {o: sum(h.outcome == o for h in want) for o in ("exact", "cached", "verified", "miss")}
        del exact  # the in-memory copy of every embedding
        sample = np.random.default_rng(0).choice(len(texts), min(SAMPLE, len(texts)), replace=False)
        for ef in efs:
            found = [entry_key(SCOPE, texts[i]) in {k for k, _ in store.similar(SCOPE, vectors[i], SERVER_COUNT, ef)}
                     for i in sample]
            server = SemanticCache(store, embedder, config=CacheConfig("direct"), ef=ef)
            got, hit_ms = _timed(lambda p: server.lookup(p["b"], SCOPE), pairs)
            _, miss_ms = _timed(lambda t: server.lookup(t, SCOPE), misses)
            out["by_ef"][ef] = {"self_recall": sum(found) / len(found), "hit_ms": hit_ms, "miss_ms": miss_ms,
                                "same": sum((g.outcome, g.prompt) == (w.outcome, w.prompt) for g, w in zip(got, want))}
        store.close()
    return out


def format_report(r: dict) -> str:
    s, mem = r["settings"], r["redis_memory"]
    lines = [f"{r['entries']:,} real-text entries ({r['search']}; insert EF {s['build_ef']}, M {s['links']}, "
             f"{s['quantization']}); filled at {r['insert_per_s']:,.0f} entries/s; exact scan: "
             + ", ".join(f"{k} {v}" for k, v in r["exact_outcomes"].items()),
             f"Redis memory used {mem['used_mb']:,.0f} MB (RSS {mem['rss_mb']:,.0f} MB); app instance RSS "
             f"{r['rss_empty_mb']:.0f} MB on an empty store, {r['rss_full_mb']:.0f} MB on this one",
             f"{'EF':>6} {'self-recall':>12} {'same outcome':>13} {'hit p50/p99 ms':>16} {'new p50/p99 ms':>16}"]
    for ef, row in r["by_ef"].items():
        (hit50, hit99), (new50, new99) = row["hit_ms"], row["miss_ms"]
        lines.append(f"{ef:>6} {row['self_recall']:>12.3f} {row['same']:>6}/{r['pairs']:<6} "
                     f"{hit50:>7.2f}/{hit99:<8.2f} {new50:>7.2f}/{new99:<8.2f}")
    lines.append(f"(the app looks up at EF {SERVER_EF}, asking for {SERVER_COUNT} neighbours)")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.cache.recall", description=__doc__.splitlines()[0])
    parser.add_argument("--cache-url", required=True, help="a Redis 8 server (redis://host:port/db)")
    parser.add_argument("--pairs", required=True, help="JSONL file(s) of {a, b, same}, comma-separated")
    parser.add_argument("--distractors", type=int, default=100_000, help="real-text entries stored")
    parser.add_argument("--ef", default=f"100,{SERVER_EF},400", help="comma-separated lookup EF values")
    parser.add_argument("--build-ef", type=int, default=BUILD_EF, help="the vector set's insert EF")
    parser.add_argument("--links", type=int, default=LINKS, help="HNSW M: links per node")
    parser.add_argument("--quantization", default="q8", choices=sorted(QUANTISATIONS))
    parser.add_argument("--namespace", help="fill (or resume filling) this namespace and keep it")
    parser.add_argument("--corpus", default="out/realtext-corpus.npz", help="the embedded pieces, made once")
    parser.add_argument("--json", help="write the report here")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        pairs = load_pairs(args.pairs)
        settings = VectorSettings(args.build_ef, args.links, args.quantization)
        efs = [int(x) for x in args.ef.split(",")]
        check_cache_url(args.cache_url)
        if args.distractors < 1:
            raise ValueError("--distractors must be at least 1")
    from engine.cache.embedder import load_default_embedder, normalise_rows

    model = load_default_embedder()
    texts, vectors = embedded_corpus(args.distractors + MISSES, Path(args.corpus), model)
    pair_texts = list(dict.fromkeys(p[k] for p in pairs for k in ("a", "b")))
    known = dict(zip(texts, vectors)) | dict(zip(pair_texts, normalise_rows(model.encode(pair_texts))))
    report = measure(args.cache_url, pairs, texts[:args.distractors], vectors[:args.distractors],
                     texts[args.distractors:], KnownEmbedder(known), settings, efs, args.namespace)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
