"""The semantic search inside Redis 8 (vector sets) against the in-memory index of Redis 7.0: which path runs,
no embeddings held on the server path, no orphan vectors after expiry / eviction / deletion, and the same
outcomes as the exact in-memory search."""
import numpy as np
import pytest

from engine.cache.disk_store import DiskStore
from engine.cache.redis_store import RedisStore
from engine.cache.semantic_cache import SemanticCache, entry_key
from engine.config import CacheConfig
from tests.helpers.redis_server import wait_until
from tests.helpers.constants import SCOPE
from tests.helpers.embedders import PrefixBlindEmbedder

pytest.importorskip("redis")


def _cache(server, namespace, **kwargs):
    store_kwargs = {k: kwargs.pop(k) for k in ("max_entries",) if k in kwargs}
    return SemanticCache(RedisStore(server.url, namespace=namespace, **store_kwargs), PrefixBlindEmbedder(), **kwargs)


def _store(cache, prompt, scope=SCOPE):
    return cache.store(prompt, scope, "an answer", [1, 2, 3], complete=True)


def orphans(server, namespace) -> list[str]:
    """Vector-set elements of ``namespace`` whose record is gone (read with plain Redis commands)."""
    client, found = server.client(), []
    for vset in client.scan_iter(match=f"{namespace}:v:*"):
        members = client.vset().vrandmember(vset, client.vset().vcard(vset)) or []
        found += [m.decode() for m in members if not client.exists(f"{namespace}:e:{m.decode()}")]
    return found


def vectors(server, namespace) -> int:
    client = server.client()
    return sum(client.vset().vcard(v) for v in client.scan_iter(match=f"{namespace}:v:*"))


def array_bytes(obj, seen=None) -> int:
    """Bytes of every numpy array reachable from ``obj`` through attributes and containers."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, type)) or obj is None:
        return 0
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(array_bytes(k, seen) + array_bytes(v, seen) for k, v in obj.items())
    if isinstance(obj, (list, tuple, set)):
        return sum(array_bytes(v, seen) for v in obj)
    if hasattr(obj, "__dict__") and type(obj).__module__.startswith(("engine", "tests")):
        return array_bytes(vars(obj), seen)
    return 0


def test_the_search_path_is_detected_once_and_named(redis_server, request):
    cache = _cache(redis_server, request.node.originalname)
    expected = {"redis7": "Redis 7.0", "redis8": "Redis 8.2"}[redis_server.kind]
    assert cache.search.startswith(expected) and cache.stats().search == cache.search
    assert cache.search.endswith("vector set" if redis_server.kind == "redis8" else ": in-memory index")


def test_an_instance_on_the_server_path_holds_no_embeddings(redis_server, request):
    cache = _cache(redis_server, request.node.originalname)
    for i in range(200):
        _store(cache, f"question number {i}")
    assert cache.lookup("please question number 7", SCOPE).outcome == "verified"
    held = array_bytes(cache)
    if redis_server.kind == "redis8":
        assert held == 0 and vectors(redis_server, request.node.originalname) == 200
    else:  # the mirror: every embedding, float32
        assert held >= 200 * PrefixBlindEmbedder().dim * 4


def test_no_orphan_vectors_after_expiry_eviction_and_deletion(redis_server, request):
    if redis_server.kind != "redis8":
        pytest.skip("vector sets only")
    ns = request.node.originalname
    short = _cache(redis_server, ns, ttl_s=0.3, max_entries=20)
    for i in range(10):
        _store(short, f"short lived {i}", scope=f"scope-{i % 3}")
    lasting = _cache(redis_server, ns, max_entries=20)
    for i in range(25):  # 35 writes, at most 20 kept: the oldest (short-lived ones first) are evicted
        _store(lasting, f"lasting {i}")
    assert orphans(redis_server, ns) == [] and vectors(redis_server, ns) == 20
    assert lasting.delete(entry_key(SCOPE, "lasting 24")) and vectors(redis_server, ns) == 19
    expiring = _cache(redis_server, ns + "-ttl", ttl_s=0.3)
    for i in range(6):
        _store(expiring, f"expiring {i}", scope=f"scope-{i % 2}")
    wait_until(lambda: not redis_server.client().exists(f"{ns}-ttl:e:{entry_key('scope-0', 'expiring 0')}"), 10,
               "the entries to expire")
    assert len(orphans(redis_server, ns + "-ttl")) == 6  # records gone, vectors left: Redis cannot expire them
    # a lookup that meets an orphan removes it
    assert expiring.lookup("please expiring 0", "scope-0").outcome == "miss"
    assert len(orphans(redis_server, ns + "-ttl")) == 5
    # the sweep (count runs a full one) removes the rest
    assert len(expiring) == 0 and orphans(redis_server, ns + "-ttl") == [] and vectors(redis_server, ns + "-ttl") == 0


def test_writes_sweep_expired_vectors_as_they_go(redis_server, request):
    if redis_server.kind != "redis8":
        pytest.skip("vector sets only")
    ns = request.node.originalname
    expiring = _cache(redis_server, ns, ttl_s=0.2)
    for i in range(50):
        _store(expiring, f"expiring {i}")
    wait_until(lambda: not redis_server.client().exists(f"{ns}:e:{entry_key(SCOPE, 'expiring 49')}"), 10,
               "the entries to expire")
    writer = _cache(redis_server, ns)
    for i in range(100):  # no lookup, no count: only writes
        _store(writer, f"lasting {i}")
    assert orphans(redis_server, ns) == [] and vectors(redis_server, ns) == 100


def _near(base: np.ndarray, cosine: float, rng) -> np.ndarray:
    """A unit vector at exactly ``cosine`` from unit ``base``."""
    noise = rng.standard_normal(base.shape[0])
    noise -= (noise @ base) * base
    return cosine * base + np.sqrt(1 - cosine ** 2) * noise / np.linalg.norm(noise)


class TableEmbedder:
    """Fake: a fixed vector per text."""

    def __init__(self, table: dict[str, np.ndarray]):
        self.table, self.dim = table, len(next(iter(table.values())))

    def encode(self, texts):
        return np.stack([self.table[t] for t in texts]).astype(np.float32)


def test_server_search_gives_the_outcomes_and_similarities_of_the_exact_search(redis_server, request, tmp_path):
    """2,000 entries; queries at cosines around the threshold (0.80) from some of them, and near several at
    once: the vector set (HNSW, int8) and the exact in-memory scan give the same hit and the same cosine."""
    rng = np.random.default_rng(0)
    dim, n = 64, 2000
    rows = rng.standard_normal((n, dim))
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    for j in range(10):
        rows[1000 + j] = _near(rows[j], 0.96, rng)  # near-duplicate entries
    table = {f"entry {i}": rows[i] for i in range(n)}
    queries = []
    for j, cosine in enumerate(np.linspace(0.76, 0.99, 40)):
        table[f"query {j}"] = _near(rows[j * 7], cosine, rng)
        queries.append(f"query {j}")
    for j in range(10):  # between two entries: which one wins decides the answer
        mid = rows[j] + rows[j + 1000] * (1 - 0.002 * j)
        table[f"between {j}"] = mid / np.linalg.norm(mid)
        queries.append(f"between {j}")
    embedder = TableEmbedder(table)
    exact = SemanticCache(DiskStore(tmp_path / "exact"), embedder, config=CacheConfig("direct"))
    server = SemanticCache(RedisStore(redis_server.url, namespace="exactness"), embedder, config=CacheConfig("direct"))
    for i in range(n):
        for cache in (exact, server):
            _store(cache, f"entry {i}")
    for q in queries:
        want, got = exact.lookup(q, SCOPE), server.lookup(q, SCOPE)
        assert (got.outcome, got.prompt) == (want.outcome, want.prompt), q
        assert got.similarity == pytest.approx(want.similarity, abs=1e-6) if want.similarity else True
    assert {exact.lookup(q, SCOPE).outcome for q in queries} >= {"miss", "verified"}
