"""Local cache storage: JSON only (a planted pickle is never loaded), bad records set aside, masked URLs."""
import json
import pickle
from pathlib import Path

import diskcache
import pytest

from engine.cache.backends import open_store
from engine.cache.disk_store import DiskStore
from engine.cache.records import mask_url
from engine.cache.semantic_cache import SemanticCache, entry_key
from tests.test_semantic_cache import SCOPE, PrefixBlindEmbedder


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
    assert [e["prompt"] for e in cache.entries()] == ["honest question"]
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
    assert "disk is full" in cache.stats()["warning"]  # ... and the failed write is still shown
    monkeypatch.setattr(diskcache.Cache, "set", real_set)
    assert cache.store("q", SCOPE, "a", [1], complete=True) and "warning" not in cache.stats()
