"""The semantic cache on a real redis-server: sharing, TTL, eviction, namespaces, faults, hostile entries."""
import dataclasses
import hashlib
import json

import pytest

from engine.cache.records import CacheRecord
from engine.cache.redis_store import RedisStore
from engine.cache.semantic_cache import SemanticCache, entry_key
from engine.config import CacheConfig
from tests.helpers.redis_server import RedisServer, wait_until
from tests.helpers.constants import SCOPE
from tests.helpers.embedders import PrefixBlindEmbedder

pytest.importorskip("redis")


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


SECRET = "a secret shared by the instances"


def _cache(url, namespace, mode="verify", secret=None, **store_kwargs):
    return SemanticCache(RedisStore(url, namespace=namespace, **store_kwargs), PrefixBlindEmbedder(), config=CacheConfig(mode),
                         secret=secret)


def _store(cache, prompt, answer="an answer", ids=(1, 2, 3)):
    return cache.store(prompt, SCOPE, answer, list(ids), complete=True)


def test_two_instances_share_exact_and_semantic_hits(redis_server, request):
    ns = request.node.originalname
    a, b = (_cache(redis_server.url, ns, mode="direct", secret=SECRET) for _ in range(2))
    assert len(b) == 0  # b's index is loaded before a writes
    assert _store(a, "What is a monad?", answer="a monoid in the category of endofunctors")
    hit = b.lookup("what is a monad", SCOPE)
    assert hit.outcome == "exact" and hit.answer == "a monoid in the category of endofunctors"
    semantic = b.lookup("please What is a monad?", SCOPE)  # found through a's change in the log
    assert semantic.outcome == "cached" and semantic.answer.startswith("a monoid")
    assert a.delete(entry_key(SCOPE, "What is a monad?")) is True
    assert b.lookup("please What is a monad?", SCOPE).outcome == "miss" and len(b) == 0
    _store(a, "kept")
    a.clear()
    assert b.lookup("please kept", SCOPE).outcome == "miss" and b.entries() == []


def test_ttl_is_redis_expiry(redis_server, request):
    cache = SemanticCache(RedisStore(redis_server.url, namespace=request.node.originalname), PrefixBlindEmbedder(),
                          ttl_s=0.3)
    _store(cache, "short lived")
    key = f"{request.node.originalname}:e:{entry_key(SCOPE, 'short lived')}"
    assert 0 < redis_server.client().pttl(key) <= 300
    wait_until(lambda: cache.lookup("short lived", SCOPE).outcome == "miss", 10, "the entry to expire")
    assert cache.lookup("please short lived", SCOPE).outcome == "miss" and len(cache) == 0


def test_oldest_entries_are_evicted_beyond_max_entries(redis_server, request):
    writer = _cache(redis_server.url, request.node.originalname, max_entries=5)
    reader = _cache(redis_server.url, request.node.originalname, max_entries=5)
    for i in range(8):
        _store(writer, f"prompt {i}")
    assert len(writer) == 5 and len(reader) == 5
    assert [reader.lookup(f"prompt {i}", SCOPE).outcome for i in (0, 2, 3, 7)] == ["miss", "miss", "exact", "exact"]
    assert reader.lookup("please prompt 1", SCOPE).outcome == "miss"  # gone from the other index too


def test_namespaces_do_not_see_each_other(redis_server, request):
    team_a = _cache(redis_server.url, request.node.originalname + "-a")
    team_b = _cache(redis_server.url, request.node.originalname + "-b")
    _store(team_a, "secret roadmap question")
    assert team_b.lookup("secret roadmap question", SCOPE).outcome == "miss"
    assert team_b.lookup("please secret roadmap question", SCOPE).outcome == "miss"
    assert len(team_b) == 0 and team_b.entries() == [] and len(team_a) == 1
    team_b.clear()
    assert team_a.lookup("secret roadmap question", SCOPE).outcome == "exact"


def test_scopes_are_not_crossed_through_redis(redis_server, request):
    a, b = _cache(redis_server.url, request.node.originalname), _cache(redis_server.url, request.node.originalname)
    _store(a, "What is the capital of France?")
    assert b.lookup("What is the capital of France?", "another-scope").outcome == "miss"
    assert b.lookup("please What is the capital of France?", "another-scope").outcome == "miss"


def _plant(server, namespace, text_prompt, overrides):
    key = entry_key(SCOPE, text_prompt)
    text = CacheRecord.new(text_prompt, SCOPE, "answer", [1, 2], PrefixBlindEmbedder().encode([text_prompt])[0],
                           1.0).to_json()
    rec = {**json.loads(text), **overrides}
    client = server.client()
    client.set(f"{namespace}:e:{key}", rec if isinstance(rec, str) else json.dumps(rec))
    client.zadd(f"{namespace}:order", {key: 1.0})
    client.xadd(f"{namespace}:log", {"op": "put", "key": key})
    return key


@pytest.mark.parametrize("overrides, moved_aside", [
    ({"answer_token_ids": ["<script>alert(1)</script>"]}, True),
    ({"answer_token_ids": [1, -5]}, True),
    ({"embedding": "not base64!"}, True),
    ({"prompt": {"html": "<img src=x onerror=alert(1)>"}}, True),
    ({"schema": 99}, True),
    ({"embedding": "AAAAAA=="}, False),  # well formed, but one float: another embedder's; skipped, kept
])
def test_malformed_entries_are_skipped_and_moved_aside(redis_server, request, overrides, moved_aside):
    ns = "bad-" + hashlib.sha256(request.node.name.encode()).hexdigest()[:12]
    cache = _cache(redis_server.url, ns, mode="direct")
    key = _plant(redis_server, ns, "planted question", overrides)
    assert cache.lookup("planted question", SCOPE).outcome == "miss"
    assert cache.lookup("please planted question", SCOPE).outcome == "miss" and cache.problem == ""
    assert redis_server.client().exists(f"{ns}:quarantine:{key}") == int(moved_aside)
    assert len(cache.entries()) == int(not moved_aside)
    assert _store(cache, "an honest question") and cache.lookup("an honest question", SCOPE).outcome == "exact"


def test_token_ids_outside_the_vocabulary_are_skipped(redis_server, request):
    cache = _cache(redis_server.url, request.node.originalname, mode="direct")
    _store(cache, "big ids", ids=[5, 70_000])
    assert cache.lookup("big ids", SCOPE, vocab_size=50_000).outcome == "miss"
    assert cache.lookup("please big ids", SCOPE, vocab_size=50_000).outcome == "miss"
    assert cache.lookup("big ids", SCOPE, vocab_size=100_000).outcome == "exact"


def test_redis_killed_mid_session_then_restarted(redis_kind):
    server = RedisServer(redis_kind).start()
    clock = FakeClock()
    try:
        cache = SemanticCache(RedisStore(server.url, namespace="kill", clock=clock, retry_after_s=5),
                              PrefixBlindEmbedder())
        _store(cache, "before the outage")
        server.stop()
        hit = cache.lookup("before the outage", SCOPE)
        assert hit.outcome == "miss" and "unavailable" in hit.reason and "127.0.0.1" in hit.reason
        assert _store(cache, "during the outage") is False  # no exception, nothing half-written
        stats = cache.stats()
        assert "unreachable" in stats.warning and stats.entries == 0
        server.start()  # same port, empty (nothing was saved)
        assert cache.lookup("anything", SCOPE).outcome == "miss" and cache.problem  # still backing off
        clock.now += 5
        assert _store(cache, "after the outage") and cache.problem == ""
        assert cache.lookup("after the outage", SCOPE).outcome == "exact" and cache.stats().warning == ""
        assert cache.lookup("please before the outage", SCOPE).outcome == "miss"  # index rebuilt from Redis
    finally:
        server.stop()


def test_a_write_lost_to_an_outage_is_no_warning_once_a_read_reaches_redis(redis_kind):
    """An instance whose answers after the outage are all hits or all cut writes nothing: the write that failed
    while Redis was down must not stay as the cache's warning once its reads reach Redis again."""
    server = RedisServer(redis_kind).start()
    clock = FakeClock()
    try:
        cache = SemanticCache(RedisStore(server.url, namespace="lost-write", clock=clock, retry_after_s=5),
                              PrefixBlindEmbedder())
        _store(cache, "before the outage")
        server.stop()
        assert _store(cache, "during the outage") is False
        assert "unreachable" in cache.problem
        server.start()
        clock.now += 5
        assert cache.lookup("anything", SCOPE).outcome == "miss"  # a read, no write
        assert cache.problem == "" and cache.stats().warning == ""
    finally:
        server.stop()


def test_redis_down_at_start_then_coming_up(redis_kind):
    server = RedisServer(redis_kind)  # not started yet
    clock = FakeClock()
    cache = SemanticCache(RedisStore(server.url, namespace="late", clock=clock, retry_after_s=1),
                          PrefixBlindEmbedder())
    assert cache.problem and cache.lookup("hello", SCOPE).outcome == "miss"
    try:
        server.start()
        clock.now += 1
        assert _store(cache, "hello") and cache.lookup("hello", SCOPE).outcome == "exact"
    finally:
        server.stop()


def test_password_is_never_shown(redis_kind):
    server = RedisServer(redis_kind, password="s3cr3t-pw").start()
    try:
        good = SemanticCache(RedisStore(server.url, namespace="pw"), PrefixBlindEmbedder())
        assert "s3cr3t-pw" not in good.location and ":***@" in good.location
        assert _store(good, "authenticated") and good.lookup("authenticated", SCOPE).outcome == "exact"
        bad_url = server.url.replace("s3cr3t-pw", "wrong-pw")
        bad = SemanticCache(RedisStore(bad_url, namespace="pw"), PrefixBlindEmbedder())
        text = json.dumps(dataclasses.asdict(bad.stats())) + bad.lookup("authenticated", SCOPE).reason
        assert "wrong-pw" not in text and "s3cr3t-pw" not in text and bad.problem
    finally:
        server.stop()

