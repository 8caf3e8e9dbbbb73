"""A cache directory somebody else wrote cannot reach outside itself.

diskcache keeps large values in files and their relative path in ``cache.db``; a planted row naming
``../../victim/a/b/notes.txt``, an absolute path, or a path through a symbolic link must never make the cache
read, remove or write anything outside its directory, and the row is removed. The same
holds for planted settings and for links where the database or the quarantine file should be. The Redis
store is audited the same way: a planted key cannot reach another namespace.
"""
import json
import os
import sqlite3
import warnings
from pathlib import Path

import diskcache
import pytest

from engine.cache.disk_store import DiskStore
from engine.cache.records import CacheRecord
from engine.cache.semantic_cache import SemanticCache, entry_key
from engine.cache.store import StoreUnavailable
from engine.config import CacheConfig
from tests.helpers.constants import SCOPE
from tests.helpers.embedders import PrefixBlindEmbedder

MODE_TEXT, MODE_BINARY = diskcache.core.MODE_TEXT, diskcache.core.MODE_BINARY


def snapshot(root: Path, skip: Path) -> dict:
    """Every file (with its bytes), folder and link under ``root``, except inside ``skip``."""
    seen = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if Path(dirpath) == skip or skip in Path(dirpath).parents:
            continue
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            if path == skip:
                continue
            seen[str(path)] = ("link", os.readlink(path)) if path.is_symlink() else \
                ("dir",) if path.is_dir() else ("file", path.read_bytes())
    return seen


def make_victims(tmp_path: Path, directory: Path) -> dict:
    """Files outside the cache a planted row points at; a valid record for a prompt among them."""
    (tmp_path / "victim" / "a" / "b").mkdir(parents=True)
    (tmp_path / "victim" / "a" / "b" / "notes.txt").write_text("the user's notes")
    (tmp_path / "victim" / "absolute.txt").write_text("another file of the user's")
    (tmp_path / "linked" / "x").mkdir(parents=True)
    (tmp_path / "linked" / "x" / "y.txt").write_text("reached through a link")
    (tmp_path / "secret.json").write_text(CacheRecord.new("what is the secret", SCOPE, "the user's secret", [7],
                                                          PrefixBlindEmbedder().encode(["what is the secret"])[0],
                                                          0.0).to_json())
    (tmp_path / "journal.txt").write_text("a file the quarantine must not append to")
    os.symlink(tmp_path / "linked", directory / "link")
    os.symlink(tmp_path / "journal.txt", directory / "quarantine.jsonl")
    return {  # entry key -> (mode, filename)
        entry_key(SCOPE, "evil relative"): (MODE_TEXT, "../../victim/a/b/notes.txt"),
        entry_key(SCOPE, "evil absolute"): (MODE_BINARY, str(tmp_path / "victim" / "absolute.txt")),
        entry_key(SCOPE, "evil link"): (MODE_TEXT, "link/x/y.txt"),
        entry_key(SCOPE, "what is the secret"): (MODE_TEXT, str(tmp_path / "secret.json")),
    }


def plant(directory: Path, rows: dict) -> None:
    con = sqlite3.connect(directory / "cache.db")
    with con:
        con.executemany("INSERT INTO Cache (key, raw, store_time, expire_time, access_time, tag, size, mode, "
                        "filename, value) VALUES (?, 1, 0, NULL, 0, 'entry', 99, ?, ?, NULL)",
                        [("e:" + key, mode, filename) for key, (mode, filename) in rows.items()])
    con.close()


def rows_with_files(directory: Path) -> int:
    con = sqlite3.connect(directory / "cache.db")
    try:
        return con.execute("SELECT count(*) FROM Cache WHERE filename IS NOT NULL OR mode != 1").fetchone()[0]
    finally:
        con.close()


@pytest.mark.parametrize("when", ["before_open", "while_open"])
def test_planted_file_rows_never_touch_anything_outside_the_cache(tmp_path, when):
    directory = tmp_path / "home" / "cache"
    with SemanticCache(directory, PrefixBlindEmbedder()) as cache:
        assert cache.store("honest question", SCOPE, "honest answer", [1, 2], complete=True)
    rows = make_victims(tmp_path, directory)
    before = snapshot(tmp_path, directory)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if when == "while_open":
            cache = SemanticCache(directory, PrefixBlindEmbedder(), config=CacheConfig("direct"))
            plant(directory, rows)
        else:
            plant(directory, rows)
            cache = SemanticCache(directory, PrefixBlindEmbedder(), config=CacheConfig("direct"))
        for prompt in ("an unrelated prompt", "evil relative", "evil absolute", "evil link", "what is the secret"):
            assert cache.lookup(prompt, SCOPE).outcome == "miss"
        assert cache.lookup("honest question", SCOPE).answer == "honest answer"
        assert [e.prompt for e in cache.entries()] == ["honest question"] and len(cache) == 1
        assert cache.store("another question", SCOPE, "another answer", [3], complete=True)
        cache.clear()
        cache.close()
    assert snapshot(tmp_path, directory) == before  # files, folders, links, bytes: all as they were
    assert rows_with_files(directory) == 0
    assert len([w for w in caught if "semantic cache" in str(w.message)]) == 1  # warned once
    assert not [p for p in directory.rglob("*") if p.is_file() and not p.is_symlink()
                and not p.name.startswith("cache.db")]  # every value inline: no file beside the database


def test_every_value_is_stored_inline_whatever_its_size(tmp_path):
    store = DiskStore(tmp_path / "c")
    store.put("big", json.dumps({"answer": "x" * 300_000}), None, None)
    assert rows_with_files(tmp_path / "c") == 0
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) <= ["cache.db", "cache.db-shm", "cache.db-wal"]


def test_planted_settings_are_removed_not_obeyed(tmp_path):
    """diskcache turns every ``disk_*`` setting into a Disk argument and every ``sqlite_*`` one into a PRAGMA."""
    directory = tmp_path / "c"
    DiskStore(directory).close()
    con = sqlite3.connect(directory / "cache.db")
    with con:
        con.executemany("INSERT OR REPLACE INTO Settings VALUES (?, ?)",
                        [("disk_min_file_size", 0), ("disk_evil", 1), ("sqlite_user_version", 666)])
    con.close()
    with pytest.warns(RuntimeWarning, match="removed 2 unexpected row"):
        store = DiskStore(directory)
    store.put("k", json.dumps({"a": 1}), None, None)
    assert rows_with_files(directory) == 0
    con = sqlite3.connect(directory / "cache.db")
    settings = dict(con.execute("SELECT key, value FROM Settings"))
    assert "disk_evil" not in settings and "sqlite_user_version" not in settings
    assert con.execute("PRAGMA user_version").fetchone()[0] == 0
    con.close()


def test_a_database_that_is_a_link_out_of_the_directory_is_refused_untouched(tmp_path):
    victim = tmp_path / "elsewhere.db"
    con = sqlite3.connect(victim)
    with con:
        con.execute("CREATE TABLE mine (x)")
    con.close()
    before = victim.read_bytes()
    directory = tmp_path / "c"
    directory.mkdir()
    os.symlink(victim, directory / "cache.db")
    with pytest.raises(StoreUnavailable, match="cache.db is a symbolic link"):
        SemanticCache(directory, PrefixBlindEmbedder())
    assert victim.read_bytes() == before


def test_redis_keys_planted_in_a_namespace_never_reach_another(redis_server):
    """The Redis audit: no file system; keys are ``<namespace>:e:<entry key>``, so a planted order entry or
    record reads, renames and deletes only inside its own namespace."""
    import redis

    from engine.cache.redis_store import RedisStore

    client = redis.Redis.from_url(redis_server.url)
    victim = SemanticCache(RedisStore(redis_server.url, namespace="victim"), PrefixBlindEmbedder())
    assert victim.store("victim question", SCOPE, "victim answer", [1], complete=True)
    outside = {k: client.dump(k) for k in client.keys("*")}
    hostile = "hostile"
    for planted in ("../victim:e:" + entry_key(SCOPE, "victim question"), "*", "victim:e:*", ":order"):
        client.zadd(f"{hostile}:order", {planted: 1})
        client.set(f"{hostile}:e:{planted}", "not a record")
    client.hset(f"{hostile}:e:{entry_key(SCOPE, 'a hash')}", "x", "1")
    cache = SemanticCache(RedisStore(redis_server.url, namespace=hostile), PrefixBlindEmbedder())
    for prompt in ("any prompt", "a hash", "victim question"):
        assert cache.lookup(prompt, SCOPE).outcome == "miss"
    cache.delete("../victim:e:" + entry_key(SCOPE, "victim question"))
    cache.clear()
    assert {k: client.dump(k) for k in client.keys("victim:*")} == \
        {k: v for k, v in outside.items() if k.startswith(b"victim:")}
    assert victim.lookup("victim question", SCOPE).answer == "victim answer"
