"""Read-only setups work: models converted elsewhere load from a read-only cache
directory, a read-only semantic cache is served read-only with a note, nothing is renamed unless SQLite calls
it corrupt, every way of naming the cache directory is checked alike, and a failed conversion leaves no lock.

Read-only is made real with tests/helpers/readonly.py (``chattr +i`` as root, who ignores permission bits).
"""
import os
from pathlib import Path

import pytest

from engine.cache.semantic_cache import SemanticCache
from engine.cache.store import StoreUnavailable
from engine.errors import ModelFormatError
from engine.models.catalog import BUILTIN_MODELS, CACHE_DIR_ENV, builtin_dir, user_gguf_dir
from tests.helpers.readonly import read_only
from tests.helpers.constants import SCOPE, SMOL
from tests.helpers.embedders import PrefixBlindEmbedder


def tree(root: Path) -> dict:
    """Every path under ``root`` with its bytes (files) or None (folders)."""
    return {str(p.relative_to(root)): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


# ---- converted models ------------------------------------------------------------------------------------
def test_a_finished_conversion_is_read_without_a_lock_from_a_read_only_cache_dir(tmp_path):
    done = tmp_path / "models" / f"{SMOL}-{BUILTIN_MODELS[SMOL].sha256[:12]}"
    done.mkdir(parents=True)
    (done / "config.json").write_text("{}")
    with read_only(tmp_path):
        assert builtin_dir(SMOL, cache_dir=tmp_path) == done
    assert [p.name for p in (tmp_path / "models").iterdir()] == [done.name]  # no lock file either


@pytest.mark.real
def test_models_converted_elsewhere_load_from_a_read_only_cache_dir(tmp_path):
    """The converted SmolLM2 (made by another process, here the default cache) seen through links from a
    read-only directory: it loads and answers."""
    from engine.models.loading import load_model

    converted = builtin_dir(SMOL)
    mirror = tmp_path / "models" / converted.name
    mirror.mkdir(parents=True)
    for item in converted.iterdir():
        os.symlink(item, mirror / item.name)
    with read_only(tmp_path):
        loaded = load_model(SMOL, "fp32", cache_dir=tmp_path)
    assert loaded.name == SMOL and loaded.vocab_size > 0
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["models", converted.name] +
                                                                 [p.name for p in converted.iterdir()])


def test_a_failed_conversion_leaves_no_lock_file(tmp_path):
    gguf = tmp_path / "damaged.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 16)  # the magic, then a version no reader handles
    with pytest.raises(ModelFormatError, match="could not convert"):
        user_gguf_dir(gguf, cache_dir=tmp_path / "cache")
    assert list((tmp_path / "cache" / "models").iterdir()) == []


# ---- the semantic cache -----------------------------------------------------------------------------------
def test_a_read_only_cache_is_served_read_only_with_a_note_and_nothing_is_moved(tmp_path):
    directory = tmp_path / "c"
    with SemanticCache(directory, PrefixBlindEmbedder()) as cache:
        assert cache.store("What is a list?", SCOPE, "an ordered sequence", [1, 2], complete=True)
        assert cache.store("What is a dict?", SCOPE, "a mapping", [3], complete=True)
    before = tree(tmp_path)
    with read_only(directory):
        cache = SemanticCache(directory, PrefixBlindEmbedder())
        assert "read-only" in cache.location and len(cache) == 2
        assert cache.lookup("what is a list", SCOPE).answer == "an ordered sequence"
        assert [e.prompt for e in cache.entries()] == ["What is a dict?", "What is a list?"]
        assert cache.store("What is a set?", SCOPE, "unique items", [4], complete=True) is False
        assert "is read-only" in cache.stats().warning and "not stored" in cache.stats().warning
        cache.delete(cache.entries()[0].key)
        cache.close()
    assert tree(tmp_path) == before  # nothing renamed, replaced, added or removed


def test_an_unreadable_read_only_cache_is_off_with_the_truth_and_left_in_place(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "cache.db").write_bytes(b"this is not a database" * 100)
    before = tree(tmp_path)
    with read_only(directory):
        with pytest.raises(StoreUnavailable, match="read-only disk cache at .*file is not a database"):
            SemanticCache(directory, PrefixBlindEmbedder())
    assert tree(tmp_path) == before


def test_a_corrupt_writable_cache_is_moved_aside_and_the_warning_names_the_new_place(tmp_path):
    directory = tmp_path / "c"
    directory.mkdir()
    (directory / "cache.db").write_bytes(b"this is not a database" * 100)
    with pytest.warns(RuntimeWarning, match="unreadable .*file is not a database.*moved to ") as caught:
        cache = SemanticCache(directory, PrefixBlindEmbedder())
    aside = str(caught[0].message).rsplit("moved to ", 1)[1].split(",")[0]
    assert (Path(aside) / "cache.db").read_bytes().startswith(b"this is not a database") and len(cache) == 0


# ---- launch.py: every way of naming the cache directory --------------------------------------------------
@pytest.fixture
def launch(monkeypatch):
    import launch as module

    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return module


@pytest.mark.parametrize("variable", [CACHE_DIR_ENV, "XDG_CACHE_HOME"])
def test_a_cache_dir_named_by_any_environment_variable_is_checked_and_named(launch, monkeypatch, tmp_path,
                                                                             variable):
    (tmp_path / "file").write_text("I am a file")
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv(variable, str(tmp_path / "file"))
    with pytest.raises(SystemExit, match=rf"\${variable}.*is a file, not a directory"):
        launch.main([])


def test_launch_serves_a_read_only_cache_dir_with_a_note(launch, monkeypatch, tmp_path, capsys):
    import engine.cache.embedder
    from engine.cache.embedder import HashEmbedder

    monkeypatch.setattr(engine.cache.embedder, "load_default_embedder", HashEmbedder)
    with launch.open_semantic_cache(tmp_path) as cache:
        assert cache.store("q", SCOPE, "a", [1], complete=True)
    capsys.readouterr()
    with read_only(tmp_path):
        cache = launch.open_semantic_cache(tmp_path)
        assert cache is not None and cache.lookup("q", SCOPE).answer == "a"
        cache.close()
    out = capsys.readouterr().out
    assert "read-only" in out and "new answers are not stored" in out and "disabled" not in out


def test_a_refused_write_stays_a_warning_after_a_read_succeeds(tmp_path):
    """A store that answers but refuses writes is not over when a read succeeds (unlike a Redis server that did
    not answer, tests/cache/test_redis_cache.py)."""
    from engine.cache.disk_store import DiskStore
    from engine.cache.readonly_store import ReadOnlyDiskStore

    with SemanticCache(DiskStore(tmp_path), PrefixBlindEmbedder()) as writable:
        assert writable.store("kept", SCOPE, "an answer", [1, 2, 3], complete=True)
    cache = SemanticCache(ReadOnlyDiskStore(tmp_path, "read-only for this test"), PrefixBlindEmbedder())
    assert cache.store("refused", SCOPE, "an answer", [1, 2], complete=True) is False and cache.problem
    assert cache.lookup("kept", SCOPE).outcome == "exact"
    assert "read-only" in cache.problem, "a read succeeding says nothing about writes being refused"
