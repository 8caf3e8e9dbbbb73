"""The semantic cache at scale: lookup latency and memory over N synthetic entries, and whether the server-side
search (Redis 8 vector sets: HNSW, int8) gives the outcomes of the exact in-memory scan. Run through
``python -m bench.cache.evaluate --latency`` / ``--exactness``.

Latency: the store is filled with N records (384-d unit vectors like MiniLM's; through a pipeline in
batches for Redis); a fresh process then opens a cache instance and times lookups. That instance's RSS is
measured on the empty store first, then on the full one: the difference is what the index costs the instance
(the whole embedding matrix on the in-memory path, nothing on the server path).
"""
from __future__ import annotations

import multiprocessing
import time
import uuid
from contextlib import contextmanager

import numpy as np
from tqdm import tqdm

from engine.cache.stores import open_store
from engine.cache.embedder import HashEmbedder, normalise_rows
from engine.cache.records import CacheRecord
from engine.cache.search import SERVER_EF
from engine.cache.semantic_cache import SemanticCache, entry_key, make_scope
from engine.config import CacheConfig, SamplingConfig

DIM = 384
SCOPE = make_scope("eval-target", "bf16", SamplingConfig(), "", [])  # as bench.cache.evaluate's
BATCH = 200  # entries per pipeline


class NearEmbedder(HashEmbedder):
    """Fake: "please X" embeds as X does, so it is a semantic hit of a stored X (a random vector per text)."""

    def encode(self, texts):
        return super().encode([t.removeprefix("please ") for t in texts])


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _percentiles(fn, n: int) -> tuple[float, float]:
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - t0)
    p50, p99 = np.percentile(np.array(times) * 1e3, [50, 99])
    return float(p50), float(p99)


def probe_instance(location: str, namespace: str | None, scope: str, n_entries: int, repeats: int) -> dict:
    """In a fresh process: open a cache instance, time lookups, report its RSS."""
    store = open_store(location, namespace=namespace) if namespace else open_store(location)
    cache = SemanticCache(store, NearEmbedder(DIM))
    if cache.problem:
        raise RuntimeError(f"cache store unavailable: {cache.problem}")
    rng = np.random.default_rng(1)
    picks = rng.integers(0, max(n_entries, 1), repeats)
    out = {"search": cache.search}
    out["miss_ms"] = _percentiles(lambda i: cache.lookup(f"novel question {i}", scope), repeats)
    if n_entries:
        found = []  # "please prompt i" embeds exactly as "prompt i": an exact search always finds it
        out["semantic_hit_ms"] = _percentiles(
            lambda i: found.append(cache.lookup(f"please prompt {picks[i]}", scope).outcome == "verified"), repeats)
        out["semantic_found"] = sum(found) / len(found)
        if cache.problem:
            raise RuntimeError(f"cache store unavailable: {cache.problem}")
        out["exact_hit_ms"] = _percentiles(lambda i: cache.lookup(f"PROMPT {picks[i]}?", scope), repeats)
    out["rss_mb"] = rss_mb()
    cache.close()
    return out


def _in_child(*args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(probe_instance, args)


def _records(scope: str, start: int, stop: int) -> list[tuple[str, str]]:
    """(entry key, record text) of the synthetic entries "prompt i", start <= i < stop."""
    prompts = [f"prompt {i}" for i in range(start, stop)]
    answer, ids = "a synthetic cached answer " * 4, list(range(24))
    return [(entry_key(scope, p), CacheRecord.new(p, scope, answer, ids, v, time.time()).to_json())
            for p, v in zip(prompts, NearEmbedder(DIM).encode(prompts))]


_worker_store = None


def _fill_batch(args) -> int:
    """In a fill worker: one batch through one pipeline."""
    global _worker_store
    location, namespace, build_ef, scope, start, stop = args
    if _worker_store is None:
        _worker_store = _bulk_store(location, namespace, build_ef)
    _worker_store.put_many(_records(scope, start, stop), None, atomic=False)
    return stop - start


def _missing(location: str, namespace: str, scope: str, n_entries: int) -> list[int]:
    """Starts of the batches whose last entry is not in the store yet (resuming a fill)."""
    import redis

    starts = list(range(0, n_entries, BATCH))
    client = redis.Redis.from_url(location)
    with client.pipeline(transaction=False) as p:
        for s in starts:
            p.exists(f"{namespace}:e:{entry_key(scope, f'prompt {min(s + BATCH, n_entries) - 1}')}")
        there = p.execute()
    return [s for s, found in zip(starts, there) if not found]


def fill(location: str, namespace: str | None, scope: str, n_entries: int, workers: int = 3,
         progress: bool = True, build_ef: int | None = None) -> tuple[float, int]:
    """Write N synthetic records ("prompt i"): for Redis, from ``workers`` processes, each batch through one
    pipeline (batches already there are skipped: a fill can be resumed); for a directory, one by one. Gives
    (seconds taken, entries written)."""
    t0 = time.perf_counter()
    starts = _missing(location, namespace, scope, n_entries) if namespace else list(range(0, n_entries, BATCH))
    written = sum(min(BATCH, n_entries - s) for s in starts)
    with tqdm(total=written, desc="fill", unit="entry", disable=not progress, smoothing=0.05) as bar:
        if namespace is None:
            store = open_store(location)
            for start in starts:
                for key, text in _records(scope, start, min(start + BATCH, n_entries)):
                    store.put(key, text, None, None)
                bar.update(min(BATCH, n_entries - start))
            store.close()
        else:
            jobs = [(location, namespace, build_ef, scope, s, min(s + BATCH, n_entries)) for s in starts]
            with multiprocessing.get_context("spawn").Pool(workers) as pool:
                for done in pool.imap_unordered(_fill_batch, jobs):
                    bar.update(done)
    return time.perf_counter() - t0, written


def _bulk_store(location: str, namespace: str | None, build_ef: int | None = None):
    """The store to fill: for Redis, one that waits up to a minute for a batch (the app's waits 0.5 s)."""
    if namespace is None:
        return open_store(location)
    from engine.cache.redis_store import RedisStore
    from engine.cache.redis_vectors import VectorSettings

    return RedisStore(location, namespace=namespace, max_entries=10**9, timeout_s=60,
                      vectors=VectorSettings(build_ef=store_build_ef(build_ef)))


def store_build_ef(build_ef: int | None) -> int:
    from engine.cache.redis_vectors import BUILD_EF

    return build_ef or BUILD_EF


def redis_memory(url: str) -> dict:
    import redis

    info = redis.Redis.from_url(url).info("memory")
    return {"used_mb": info["used_memory"] / 2**20, "rss_mb": info["used_memory_rss"] / 2**20}


@contextmanager
def scratch(cache_url: str | None, keep: str | None = None):
    """(location, namespace) of a throw-away store, dropped afterwards; ``keep``: this namespace, kept."""
    import tempfile

    if cache_url and keep:
        yield cache_url, keep
    elif cache_url:
        namespace = f"speclens-scale-{uuid.uuid4().hex[:8]}"
        try:
            yield cache_url, namespace
        finally:
            store = open_store(cache_url, namespace=namespace)
            store.drop()
            store.close()
    else:
        with tempfile.TemporaryDirectory() as tmp:
            yield tmp + "/cache", None


def measure_latency(n_entries: int, cache_url: str | None = None, repeats: int = 300, progress: bool = True,
                    build_ef: int | None = None, namespace: str | None = None) -> dict:
    """``namespace``: fill (or finish filling) this Redis namespace and keep it, instead of a throw-away one."""
    out = {"entries": n_entries, "backend": "redis" if cache_url else "disk", "build_ef": store_build_ef(build_ef)}
    with scratch(cache_url) as (location, empty_ns):
        empty = _in_child(location, empty_ns, SCOPE, 0, 50)
    with scratch(cache_url, namespace) as (location, namespace):
        seconds, written = fill(location, namespace, SCOPE, n_entries, progress=progress, build_ef=build_ef)
        out["insert_per_s"] = written / seconds if written else None
        if cache_url:
            out["redis_memory"] = redis_memory(cache_url)
        full = _in_child(location, namespace, SCOPE, n_entries, repeats)
    out.update(full, rss_empty_mb=empty["rss_mb"], rss_growth_mb=full["rss_mb"] - empty["rss_mb"])
    return out


def format_latency(r: dict) -> str:
    mem = r.get("redis_memory")
    lines = [f"entries               {r['entries']} ({r['backend']}; search: {r['search']}; insert EF {r['build_ef']})",
             f"insert                {r['insert_per_s'] or 0:,.0f} entries/s",
             f"semantic miss         p50 {r['miss_ms'][0]:.2f} ms   p99 {r['miss_ms'][1]:.2f} ms",
             f"semantic hit          p50 {r['semantic_hit_ms'][0]:.2f} ms   p99 {r['semantic_hit_ms'][1]:.2f} ms"
             f"   (found {r['semantic_found']:.0%}; an exact scan finds 100%)",
             f"exact hit             p50 {r['exact_hit_ms'][0]:.2f} ms   p99 {r['exact_hit_ms'][1]:.2f} ms",
             f"instance RSS          {r['rss_mb']:.0f} MB (empty cache {r['rss_empty_mb']:.0f} MB,"
             f" +{r['rss_growth_mb']:.0f} MB)"]
    if mem:
        lines.append(f"Redis memory          used {mem['used_mb']:,.0f} MB, RSS {mem['rss_mb']:,.0f} MB")
    return "\n".join(lines)


# ---- exactness: the server search against the exact scan, on the labelled pairs ------------------------
def _distractors(real: np.ndarray, n: int, rng) -> np.ndarray:
    """``n`` unit vectors: half random, half near the real ones (cosine ~0.6-0.75, below the threshold), so
    that the graph around the real entries is crowded."""
    rand = rng.standard_normal((n - n // 2, real.shape[1]))
    base = real[rng.integers(0, len(real), n // 2)]
    near = base + rng.uniform(0.9, 1.3, (n // 2, 1)) * normalise_rows(rng.standard_normal(base.shape)) \
        * np.sqrt(1 - 0.7 ** 2) / 0.7
    return normalise_rows(np.concatenate([rand, near]))


def _add_distractors(store, real: np.ndarray, distractors: int, progress: bool) -> None:
    others = _distractors(real, distractors, np.random.default_rng(0))
    for start in tqdm(range(0, distractors, BATCH), desc="distractors", disable=not progress):
        store.put_many([(f"d{i}", CacheRecord.new(f"distractor {i}", SCOPE, "x", [0], v, 0.0).to_json())
                        for i, v in enumerate(others[start:start + BATCH], start)], None, atomic=False)


def measure_exactness(pairs: list[dict], embedder, cache_url: str, distractors: int, efs: list[int],
                      judge=None, progress: bool = True, build_ef: int | None = None,
                      namespace: str | None = None) -> dict:
    """All pairs' ``a`` in one scope among ``distractors`` other entries; each ``b`` looked up in direct mode
    through the exact in-memory scan and through the server search at each EF. Counts equal outcomes (the
    outcome and the matched prompt). ``embedder``: best one that remembers its vectors (the pairs' texts are
    encoded many times). ``namespace``: the distractors are the synthetic entries of ``--latency`` in this kept
    namespace (filled, or the fill finished, as there; random vectors only), so one million-entry fill
    serves both measurements."""
    verdicts: dict[tuple[str, str], bool] = {}
    memo_judge = None if judge is None else (lambda a, b: verdicts.setdefault((a, b), judge(a, b)))
    out = {"pairs": len(pairs), "distractors": distractors, "by_ef": {}, "build_ef": store_build_ef(build_ef),
           "distractor_kind": "synthetic (latency fill)" if namespace else "half random, half near the pairs"}
    with scratch(cache_url, namespace) as (location, namespace_):
        store = _bulk_store(location, namespace_, build_ef)
        if namespace:
            fill(location, namespace_, SCOPE, distractors, progress=progress, build_ef=build_ef)
        else:
            _add_distractors(store, normalise_rows(embedder.encode([p["a"] for p in pairs])), distractors, progress)
        writer = SemanticCache(store, embedder, config=CacheConfig("direct"))
        for p in pairs:
            writer.store(p["a"], SCOPE, "<cached answer>", [0], complete=True)
        exact = SemanticCache(store, embedder, config=CacheConfig("direct"), search="memory")
        want = [exact.lookup(p["b"], SCOPE, judge=memo_judge) for p in pairs]
        out["exact_outcomes"] = {o: sum(h.outcome == o for h in want) for o in ("exact", "cached", "verified", "miss")}
        for ef in efs:
            server = SemanticCache(store, embedder, config=CacheConfig("direct"), ef=ef)
            got = [server.lookup(p["b"], SCOPE, judge=memo_judge) for p in pairs]
            same = sum((g.outcome, g.prompt) == (w.outcome, w.prompt) for g, w in zip(got, want))
            out["search"] = server.search
            out["by_ef"][ef] = {"same": same, "max_similarity_error": max(
                (abs(g.similarity - w.similarity) for g, w in zip(got, want) if g.similarity and w.similarity),
                default=0.0)}
        store.close()
    out["judge_calls"] = len(verdicts) if judge is not None else None
    return out


def format_exactness(r: dict) -> str:
    o = r["exact_outcomes"]
    lines = [f"{r['pairs']} pairs among {r['distractors']:,} distractors ({r['search']}, insert EF {r['build_ef']}); "
             f"exact scan: exact "
             f"{o['exact']}, cached {o['cached']}, verified {o['verified']}, miss {o['miss']}"
             + (f"; judge verdicts {r['judge_calls']}" if r["judge_calls"] is not None else ""),
             f"{'EF':>6} {'same outcome':>13} {'max |cos error|':>16}"]
    for ef, row in r["by_ef"].items():
        lines.append(f"{ef:>6} {row['same']:>6}/{r['pairs']:<6} {row['max_similarity_error']:>16.2e}")
    lines.append(f"(the app uses EF {SERVER_EF})")
    return "\n".join(lines)
