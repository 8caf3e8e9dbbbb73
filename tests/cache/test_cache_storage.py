"""Cache storage: the Store contract (real stores and fakes, signatures included), no import circle, JSON
only (a planted pickle is never loaded), bad records set aside, masked URLs, and only store failures handled."""
import ast
import inspect
import json
import pickle
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import diskcache
import pytest

from engine.cache.stores import open_store
from engine.cache.disk_store import DiskStore
from engine.cache.records import CacheRecord, mask_url
from engine.cache.semantic_cache import SemanticCache, entry_key
from engine.cache.store import Change, SearchingStore, Store, StoreUnavailable, Token
from tests.helpers.constants import SCOPE
from tests.helpers.embedders import PrefixBlindEmbedder

ROOT = Path(__file__).resolve().parents[2]


class MemoryStore:
    """Fake store: records in a dict, every change logged; ``fail`` (an exception) is raised by every verb."""

    def __init__(self, shared: bool = False):
        self.location, self.fail, self.shared = "memory", None, shared
        self._texts: dict[str, str] = {}
        self._log: list[Change] = []

    def _check(self) -> None:
        if self.fail is not None:
            raise self.fail

    def get(self, key: str) -> CacheRecord | None:
        self._check()
        return CacheRecord.from_json(self._texts[key]) if key in self._texts else None

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        self._check()
        self._texts[key] = text
        self._log.append(("put", key))
        return len(self._log) if after == len(self._log) - 1 else None

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        self._check()
        existed = self._texts.pop(key, None) is not None
        self._log.append(("del", key))
        return existed, len(self._log) if after == len(self._log) - 1 else None

    def clear(self) -> None:
        self._check()
        self._texts.clear()
        self._log.append(("clear", ""))

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
        self._check()
        return iter([(k, self.get(k)) for k in list(self._texts)])

    def count(self) -> int:
        self._check()
        return len(self._texts)

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        self._check()
        token = len(self._log)
        if since is None or any(op == "clear" for op, _ in self._log[since:]):
            return token, None
        return token, self._log[since:]

    def close(self) -> None:
        pass


FAKE_STORES = [MemoryStore]  # every fake store in tests/: checked against the Store Protocol below


# ---- the Store contract -------------------------------------------------------------------------------
def protocol_mismatches(store, protocol=Store) -> list[str]:
    """How ``store`` differs from the ``protocol`` (Store by default): missing verbs, other signatures (names,
    kinds, defaults, annotations), a missing or non-text ``location``."""
    problems = [] if isinstance(getattr(store, "location", None), str) else ["location is not a str"]
    if not isinstance(getattr(store, "shared", None), bool):
        problems.append("shared is not a bool")
    for name, verb in inspect.getmembers(protocol, inspect.isfunction):
        if name.startswith("_"):
            continue
        impl = getattr(type(store), name, None)
        if impl is None:
            problems.append(f"no {name}")
            continue
        want, got = inspect.signature(verb, eval_str=True), inspect.signature(impl, eval_str=True)
        if got != want:
            problems.append(f"{type(store).__name__}.{name}{got} != Store.{name}{want}")
    return problems


def test_the_protocol_check_sees_signatures_not_only_names():
    class Sloppy(MemoryStore):
        def put(self, key, text, ttl_s, after):  # the same names, no types
            return None

        def changes(self, since: Token | None = None) -> tuple[Token, list[Change] | None]:  # a default added
            return 0, None
    assert {"Sloppy.put", "Sloppy.changes"} == {p.split("(")[0] for p in protocol_mismatches(Sloppy())}
    assert protocol_mismatches(MemoryStore()) == []


def test_disk_store_and_fake_stores_satisfy_the_store_protocol(tmp_path):
    for store in (DiskStore(tmp_path / "c"), *(fake() for fake in FAKE_STORES)):
        assert isinstance(store, Store) and protocol_mismatches(store) == []
        assert not isinstance(store, SearchingStore)  # these search in memory (engine/cache/search.py)


def test_redis_store_satisfies_the_store_protocol(redis_server):
    from engine.cache.redis_store import RedisStore

    store = RedisStore(redis_server.url, namespace="protocol")
    assert isinstance(store, Store) and protocol_mismatches(store) == []
    assert isinstance(store, SearchingStore) and protocol_mismatches(store, SearchingStore) == []


def test_every_fake_store_in_the_tests_is_checked():
    verbs = {name for name, _ in inspect.getmembers(Store, inspect.isfunction) if not name.startswith("_")}
    found = set()
    for path in (ROOT / "tests").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                methods = {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
                if verbs <= methods:
                    found.add(node.name)
    assert found == {fake.__name__ for fake in FAKE_STORES}


def test_the_cache_package_has_no_import_circle():
    """Each engine/cache module's imports of engine.cache modules, lazy ones included, form no cycle."""
    graph = {}
    for path in (ROOT / "engine" / "cache").glob("*.py"):
        imports = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("engine.cache."):
                imports.add(node.module.removeprefix("engine.cache."))
        graph[path.stem] = imports
    done, on_path = set(), []

    def visit(module):
        assert module not in on_path, f"import circle: {' -> '.join(on_path[on_path.index(module):] + [module])}"
        if module not in done:
            on_path.append(module)
            for other in sorted(graph.get(module, ())):
                visit(other)
            on_path.pop()
            done.add(module)
    for module in sorted(graph):
        visit(module)
    assert "backends" not in graph["disk_store"] | graph["redis_store"]


# ---- counting is not syncing ---------------------------------------------------------------------------
class VerbLog(MemoryStore):
    """MemoryStore that logs the verbs the cache calls, and can lose an entry without a logged change (as TTL
    expiry and size-limit eviction do)."""

    def __init__(self):
        super().__init__()
        self.calls: list[str] = []

    def count(self) -> int:
        self.calls.append("count")
        return super().count()

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        self.calls.append("changes")
        return super().changes(since)

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
        self.calls.append("records")
        return super().records()

    def lose(self, key: str) -> None:
        del self._texts[key]


def test_len_only_counts_and_refresh_is_the_one_call_that_resyncs_the_index():
    store = VerbLog()
    cache = SemanticCache(store, PrefixBlindEmbedder())
    for prompt in ("kept", "lost"):
        assert cache.store(prompt, SCOPE, "a", [1], complete=True)
    store.lose(entry_key(SCOPE, "lost"))
    store.calls.clear()
    assert len(cache) == 1 and store.calls == ["count"]  # a count, nothing else: len() has no side effect
    store.calls.clear()
    assert cache.refresh() == 1 and store.calls == ["count", "changes", "changes", "records"]  # 1 != 2: reload
    store.calls.clear()
    assert cache.refresh() == 1 and store.calls == ["count", "changes"]  # in step now: nothing to reload
    store.lose(entry_key(SCOPE, "kept"))
    store.calls.clear()
    assert cache.stats().entries == 0 and store.calls == ["count", "changes", "changes", "records"]  # stats refreshes
    store.calls.clear()
    assert cache.lookup("please kept", SCOPE).outcome == "miss" and store.calls == ["changes"]  # the log, no count


# ---- store failures are handled, bugs are not ---------------------------------------------------------
def test_a_store_that_is_unavailable_gives_misses_and_refused_writes_with_the_reason():
    store = MemoryStore()
    cache = SemanticCache(store, PrefixBlindEmbedder())
    assert cache.store("q", SCOPE, "a", [1], complete=True) and cache.lookup("q", SCOPE).outcome == "exact"
    store.fail = StoreUnavailable("memory is on strike")
    assert cache.store("q2", SCOPE, "a", [1], complete=True) is False
    hit = cache.lookup("q", SCOPE)
    assert hit.outcome == "miss" and "on strike" in hit.reason and "on strike" in cache.stats().warning


@pytest.mark.parametrize("bug", [TypeError("a bug"), KeyError("a bug"), AttributeError("a bug")])
def test_a_bug_in_a_store_propagates_instead_of_reading_as_unavailable(bug):
    store = MemoryStore()
    cache = SemanticCache(store, PrefixBlindEmbedder())
    store.fail = bug
    with pytest.raises(type(bug), match="a bug"):
        cache.store("q", SCOPE, "a", [1], complete=True)
    with pytest.raises(type(bug), match="a bug"):
        cache.lookup("q", SCOPE)


def _raising(error):
    def raising(*args, **kwargs):
        raise error
    return raising


@pytest.mark.parametrize("failure", [sqlite3.OperationalError("database or disk is full"),
                                     diskcache.Timeout("database is locked"), PermissionError("read-only")])
def test_a_disk_that_cannot_be_written_makes_the_store_unavailable(tmp_path, monkeypatch, failure):
    store = DiskStore(tmp_path / "c")
    monkeypatch.setattr(diskcache.Cache, "set", _raising(failure))
    with pytest.raises(StoreUnavailable, match=type(failure).__name__):
        store.put("k", "{}", None, None)


def test_a_bug_under_the_disk_store_propagates(tmp_path, monkeypatch):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    monkeypatch.setattr(diskcache.Cache, "set", _raising(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        cache.store("q", SCOPE, "a", [1], complete=True)
    assert cache.problem == ""


def test_a_redis_that_refuses_writes_is_unavailable_and_a_bug_propagates(redis_server, monkeypatch):
    import redis

    from engine.cache.redis_store import RedisStore

    cache = SemanticCache(RedisStore(redis_server.url, namespace="refuses"), PrefixBlindEmbedder())
    monkeypatch.setattr(redis.client.Pipeline, "execute",
                        _raising(redis.exceptions.OutOfMemoryError("command not allowed when used memory")))
    assert cache.store("q", SCOPE, "a", [1], complete=True) is False and "OutOfMemoryError" in cache.problem
    monkeypatch.setattr(redis.client.Pipeline, "execute", _raising(redis.exceptions.DataError("a bug")))
    with pytest.raises(redis.exceptions.DataError, match="a bug"):
        RedisStore(redis_server.url, namespace="refuses-too").put("k", "{}", None, None)


def test_an_answer_that_no_reader_would_accept_is_not_stored(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    assert cache.store("q", SCOPE, "a", [1, -2], complete=True) is False  # a negative token id
    assert cache.store("q", SCOPE, "a\udc00", [1], complete=True) is False  # UTF-8 cannot encode it
    assert len(cache) == 0 and cache.problem == ""
    with pytest.raises(ValueError):  # not a token id at all: the caller's bug
        cache.store("q", SCOPE, "a", ["one"], complete=True)


class Planted:
    """Unpickling this creates the file ``marker``: proof that a pickle ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return Path.touch, (self.marker,)


def test_a_planted_pickle_is_never_loaded_and_is_moved_aside(tmp_path):
    directory, marker = tmp_path / "c", tmp_path / "pwned"
    with SemanticCache(directory, PrefixBlindEmbedder()) as cache:
        cache.store("honest question", SCOPE, "honest answer", [1, 2], complete=True)
    planter = diskcache.Cache(str(directory))  # the default Disk pickles
    planter.set("e:" + entry_key(SCOPE, "evil question"), Planted(marker))
    planter.set("meta:version", Planted(marker))
    planter.set(("e:tuple-key", Planted(marker)), "x")  # a pickled key
    planter.close()
    assert pickle.loads(pickle.dumps(Planted(tmp_path / "probe"))) is None and (tmp_path / "probe").exists()
    with pytest.warns(RuntimeWarning, match="quarantine"):
        cache = SemanticCache(directory, PrefixBlindEmbedder())
    assert cache.lookup("evil question", SCOPE).outcome == "miss" and len(cache) == 1
    assert cache.lookup("honest question", SCOPE).answer == "honest answer"
    assert [e.prompt for e in cache.entries()] == ["honest question"]
    assert not marker.exists()
    moved = [json.loads(line) for line in (directory / "quarantine.jsonl").read_text().splitlines()]
    assert len(moved) == 3 and all(m["mode"] == 4 or m["raw"] == 0 for m in moved)


def test_a_pickle_planted_under_an_open_cache_is_refused(tmp_path):
    directory, marker = tmp_path / "c", tmp_path / "pwned"
    cache = SemanticCache(directory, PrefixBlindEmbedder())
    planter = diskcache.Cache(str(directory))
    planter.set("e:" + entry_key(SCOPE, "late evil"), Planted(marker))
    planter.close()
    assert cache.lookup("late evil", SCOPE).outcome == "miss" and len(cache) == 0
    assert not marker.exists() and cache.problem == ""


@pytest.mark.parametrize("text", ["not json", json.dumps([1, 2]), json.dumps({"schema": 1, "prompt": 3}), "7"])
def test_malformed_json_records_are_skipped_and_dropped(tmp_path, text):
    store = DiskStore(tmp_path / "c")
    store.put("k1", text, None, None)
    assert store.get("k1") is None and store.count() == 0


def test_open_store_picks_the_backend_from_the_location(tmp_path):
    assert isinstance(open_store(tmp_path / "c"), DiskStore)
    redis_store = pytest.importorskip("engine.cache.redis_store")
    store = open_store("redis://:hunter2@127.0.0.1:1/3", namespace="team-a")
    assert isinstance(store, redis_store.RedisStore) and "hunter2" not in store.location


def test_mask_url_hides_only_the_password():
    assert mask_url("redis://:hunter2@cache.local:6380/2") == "redis://:***@cache.local:6380/2"
    assert mask_url("redis://bob:hunter2@h:1/0") == "redis://bob:***@h:1/0"
    assert mask_url("redis://h:6379/0") == "redis://h:6379/0"


def test_a_failed_write_stays_visible_until_a_write_succeeds(tmp_path, monkeypatch):
    import sqlite3

    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    real_set = diskcache.Cache.set

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(diskcache.Cache, "set", disk_full)
    assert cache.store("q", SCOPE, "a", [1], complete=True) is False
    assert cache.lookup("q", SCOPE).outcome == "miss"  # reads still work ...
    assert "disk is full" in cache.stats().warning  # ... and the failed write is still shown
    monkeypatch.setattr(diskcache.Cache, "set", real_set)
    assert cache.store("q", SCOPE, "a", [1], complete=True) and cache.stats().warning == ""


def test_a_disk_store_that_cannot_be_opened_is_unavailable_and_a_bug_propagates(tmp_path, monkeypatch):
    real_init = diskcache.Cache.__init__

    def locked(*args, **kwargs):
        raise sqlite3.OperationalError("database is locked")
    monkeypatch.setattr(diskcache.Cache, "__init__", locked)
    with pytest.raises(StoreUnavailable, match="locked"):
        DiskStore(tmp_path / "c")
    monkeypatch.setattr(diskcache.Cache, "__init__", _raising(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        DiskStore(tmp_path / "c")
    monkeypatch.setattr(diskcache.Cache, "__init__", real_init)
    assert DiskStore(tmp_path / "c").count() == 0
