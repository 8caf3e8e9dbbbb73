"""Semantic cache: scopes, outcomes, guards in direct mode, persistence, corruption, processes, TTL, scale."""
import glob
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.config import CacheConfig, SamplingConfig
from engine.cache.embedder import HashEmbedder, load_default_embedder
from engine.errors import InvalidSettingError
from engine.cache.semantic_cache import CacheHit, SemanticCache, entry_key, make_scope, normalise_prompt
from engine.cache.stats import CacheEntry, CacheStats
from engine.cache.store import StoreUnavailable
from tests.helpers.constants import SCOPE
from tests.helpers.embedders import PrefixBlindEmbedder

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def minilm():
    """The real MiniLM embedder: only for tests about what counts as a paraphrase (marked ``real``)."""
    return load_default_embedder()


def _store(cache, prompt, scope=SCOPE, answer="an answer", complete=True):
    return cache.store(prompt, scope, answer, [1, 2, 3], complete=complete)


# ---- scope --------------------------------------------------------------------------------------
def test_make_scope_is_stable_and_covers_what_shapes_the_answer():
    base = dict(target="t", precision="bf16", sampling=SamplingConfig(), system_prompt="sys",
                history=[{"role": "user", "content": "hi"}])
    assert make_scope(**base) == make_scope(**base)
    variants = [dict(target="t2"), dict(precision="int8"), dict(sampling=SamplingConfig(temperature=0.7)),
                dict(sampling=SamplingConfig(top_p=0.9)), dict(sampling=SamplingConfig(top_k=40)),
                dict(system_prompt="other"), dict(history=[]), dict(history=[{"role": "user", "content": "yo"}])]
    scopes = {make_scope(**{**base, **v}) for v in variants}
    assert len(scopes) == len(variants) and make_scope(**base) not in scopes
    # the seed matters only when sampling; max_new_tokens never
    assert make_scope(**{**base, "sampling": SamplingConfig(seed=1)}) == make_scope(**base)
    assert make_scope(**{**base, "sampling": SamplingConfig(max_new_tokens=9)}) == make_scope(**base)
    hot = lambda seed: make_scope(**{**base, "sampling": SamplingConfig(temperature=0.7, seed=seed)})  # noqa: E731
    assert hot(1) != hot(2)


def test_lookup_never_crosses_scopes(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(), config=CacheConfig("direct"))
    _store(cache, "What is the capital of France?")
    others = [make_scope("llama-3b", "bf16", SamplingConfig(), "You are helpful.", []),
              make_scope("qwen-1.5b", "bf16", SamplingConfig(temperature=0.8), "You are helpful.", []),
              make_scope("qwen-1.5b", "bf16", SamplingConfig(), "Answer in French.", []),
              make_scope("qwen-1.5b", "bf16", SamplingConfig(), "You are helpful.",
                         [{"role": "user", "content": "x"}])]
    for scope in others:
        assert cache.lookup("What is the capital of France?", scope).outcome == "miss"
        assert cache.lookup("please What is the capital of France?", scope).outcome == "miss"
    assert cache.lookup("What is the capital of France?", SCOPE).outcome == "exact"
    assert cache.lookup("please What is the capital of France?", SCOPE).outcome == "cached"  # same scope: a hit


# ---- outcomes -----------------------------------------------------------------------------------
def test_exact_hit_ignores_case_whitespace_and_trailing_punctuation(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    assert _store(cache, "How do I reverse a list in Python?", answer="xs[::-1]")
    assert normalise_prompt("  how do I   reverse a LIST in python ?!") == "how do i reverse a list in python"
    hit = cache.lookup("  how do I   reverse a LIST in python ?!", SCOPE, CacheConfig("direct"))
    assert hit == CacheHit("exact", entry_key(SCOPE, "How do I reverse a list in Python?"),
                           "How do I reverse a list in Python?", "xs[::-1]", (1, 2, 3), 1.0, "")
    assert hit.to_event().outcome == "exact"
    checked = cache.lookup("  how do I   reverse a LIST in python ?!", SCOPE)  # verify mode: the target checks it
    assert checked.outcome == "exact" and checked.needs_check and "verify mode" in checked.reason


@pytest.mark.real
def test_verify_mode_sends_every_semantic_hit_to_verification(tmp_path, minilm):
    cache = SemanticCache(tmp_path / "c", minilm)  # mode "verify" by default
    _store(cache, "How do I reverse a list in Python?")
    for prompt in ("What's the way to reverse a Python list?", "How do I reverse a string in Python?"):
        hit = cache.lookup(prompt, SCOPE)
        assert hit.outcome == "verified" and hit.similarity >= cache.config.threshold and hit.answer == "an answer"
    assert cache.lookup("What is the tallest building in Asia?", SCOPE).outcome == "miss"


@pytest.mark.real
def test_direct_mode_serves_only_hits_that_pass_the_guards(tmp_path, minilm):
    cache = SemanticCache(tmp_path / "c", minilm, config=CacheConfig("direct"))
    _store(cache, "Convert 100 Celsius to Fahrenheit.")
    served = cache.lookup("What is 100 degrees Celsius in Fahrenheit?", SCOPE)
    assert served.outcome == "cached" and served.reason == ""
    swapped = cache.lookup("Convert 100 Fahrenheit to Celsius.", SCOPE)
    assert swapped.outcome == "verified" and swapped.similarity > 0.95 and "order" in swapped.reason
    other_number = cache.lookup("Convert 37 Celsius to Fahrenheit.", SCOPE)
    assert other_number.outcome == "verified" and "numbers" in other_number.reason
    assert swapped.to_event().reason == swapped.reason


def test_incomplete_answers_are_never_stored(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    assert _store(cache, "Tell me a long story", complete=False) is False
    assert cache.store("   ", SCOPE, "x", [1], complete=True) is False
    assert len(cache) == 0 and cache.lookup("Tell me a long story", SCOPE).outcome == "miss"


# ---- persistence, deletion, TTL, eviction --------------------------------------------------------
def test_entries_survive_reopening(tmp_path):
    with SemanticCache(tmp_path / "c", PrefixBlindEmbedder()) as cache:
        _store(cache, "Why is the sky blue?", answer="Rayleigh scattering")
    with SemanticCache(tmp_path / "c", PrefixBlindEmbedder()) as cache:
        assert len(cache) == 1
        assert cache.lookup("why is the sky blue", SCOPE).answer == "Rayleigh scattering"
        assert cache.lookup("please Why is the sky blue?", SCOPE).outcome == "verified"


def test_delete_clear_entries_and_stats(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(), config=CacheConfig("direct"))
    for i in range(3):
        _store(cache, f"question {i}", answer=f"answer {i}")
    listed = cache.entries(limit=2)
    assert [e.prompt for e in listed] == ["question 2", "question 1"]
    assert listed[0] == CacheEntry(entry_key(SCOPE, "question 2"), "question 2", "answer 2", listed[0].created, SCOPE)
    assert cache.delete(entry_key(SCOPE, "question 1")) is True
    assert cache.lookup("question 1", SCOPE).outcome == "miss"
    assert cache.lookup("please question 1", SCOPE).outcome == "miss"  # gone from the index too
    assert cache.lookup("please question 0", SCOPE).outcome == "cached"
    cache.record_saved(1.5)
    stats = cache.stats()
    assert isinstance(stats, CacheStats) and stats.lookups == 3 and stats.misses == 2 and stats.hits["cached"] == 1
    assert stats.time_saved_s == 1.5 and stats.entries == 2 and stats.hit_rate == pytest.approx(1 / 3)
    cache.clear()
    assert len(cache) == 0 and cache.lookup("question 0", SCOPE).outcome == "miss"


class FakeClock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_ttl_expires_entries(tmp_path):
    clock = FakeClock()
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(), ttl_s=60, clock=clock)
    _store(cache, "short lived")
    clock.now += 59
    assert cache.lookup("short lived", SCOPE).outcome == "exact" and len(cache) == 1
    clock.now += 2
    assert cache.lookup("short lived", SCOPE).outcome == "miss"
    assert cache.lookup("please short lived", SCOPE).outcome == "miss"
    assert cache.entries() == []


def test_size_limit_evicts_oldest(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(), size_limit_bytes=200_000)
    for i in range(300):
        _store(cache, f"prompt {i}", answer="x" * 4000)
    assert len(cache) < 300
    assert cache.lookup("prompt 299", SCOPE).outcome == "exact"
    assert cache.lookup("prompt 0", SCOPE).outcome == "miss"
    assert cache.lookup("please prompt 0", SCOPE).outcome == "miss"  # stale index row skipped, no error


# ---- corruption -----------------------------------------------------------------------------------
def test_corrupt_database_is_moved_aside_and_rebuilt(tmp_path):
    directory = tmp_path / "c"
    with SemanticCache(directory, PrefixBlindEmbedder()) as cache:
        _store(cache, "What is a monad?")
    for f in directory.glob("cache.db*"):
        f.write_bytes(b"\x00garbage, not sqlite" * 500)
    with pytest.warns(RuntimeWarning, match="moved to"):
        cache = SemanticCache(directory, PrefixBlindEmbedder())
    assert len(cache) == 0 and len(glob.glob(f"{directory}.corrupt-*")) == 1
    assert _store(cache, "What is a monad?") and cache.lookup("What is a monad?", SCOPE).outcome == "exact"


def test_corruption_under_an_open_cache_is_recovered(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder())
    _store(cache, "before")
    for f in (tmp_path / "c").glob("cache.db*"):
        f.write_bytes(b"\x00garbage" * 5000)
    with pytest.warns(RuntimeWarning):
        assert cache.lookup("before", SCOPE).outcome == "miss"
    assert _store(cache, "after") and cache.lookup("after", SCOPE).outcome == "exact" and len(cache) == 1


def test_a_file_in_place_of_the_directory_is_left_alone_and_the_cache_is_unavailable(tmp_path):
    """Not a damaged cache but somebody's file: it is neither renamed nor replaced."""
    directory = tmp_path / "c"
    directory.write_text("not a directory")
    with pytest.raises(StoreUnavailable, match="is a file, not a directory; it is left as it is"):
        SemanticCache(directory, PrefixBlindEmbedder())
    assert directory.read_text() == "not a directory" and os.listdir(tmp_path) == ["c"]


# ---- processes and scale ---------------------------------------------------------------------------
def test_two_processes_writing_at_once_lose_nothing(tmp_path):
    directory, n = str(tmp_path / "c"), 600
    reader = SemanticCache(directory, PrefixBlindEmbedder(64))
    assert len(reader) == 0  # index loaded before the writers start
    procs = [subprocess.Popen([sys.executable, "-m", "tests.helpers.cache_writer", directory, name, str(n)], cwd=REPO,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for name in ("alpha", "beta")]
    assert [p.stdout.readline().strip() for p in procs] == ["ready", "ready"]
    for p in procs:  # both write their first halves, then both their second: each writes while the other has
        p.stdin.write("go\n")  # entries in the store (no wall-clock assumption)
        p.stdin.flush()
    assert [p.stdout.readline().strip() for p in procs] == ["half", "half"]
    assert len(reader) == n
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.close()
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    assert len(reader) == 2 * n
    for name in ("alpha", "beta"):
        for i in (0, n // 2, n - 1):
            assert reader.lookup(f"{name} question {i}", "scope").answer == f"{name} answer {i}"
            hit = reader.lookup(f"please {name} question {i}", "scope")  # semantic tier: reloaded index
            assert hit.outcome == "verified" and hit.answer == f"{name} answer {i}"


@pytest.mark.slow  # 10,000 stores: 7 s on 2 Zen 3 cores, a tenth of the fast tier's spare
def test_lookup_over_10000_entries(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(384))
    for i in range(10_000):
        _store(cache, f"entry {i}", answer=f"answer {i}")
    assert len(cache) == 10_000
    hit = cache.lookup("please entry 4242", SCOPE)  # timings: python -m bench.cache.evaluate --latency
    assert hit.outcome == "verified" and hit.answer == "answer 4242" and hit.similarity == pytest.approx(1.0)
    assert cache.lookup("something else entirely", SCOPE).outcome == "miss"
    reopened = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(384))
    assert reopened.lookup("please entry 7", SCOPE).answer == "answer 7"


def test_a_lookup_takes_its_settings_from_the_request_else_the_cache(tmp_path):
    cache = SemanticCache(tmp_path / "c", PrefixBlindEmbedder(), config=CacheConfig("direct", 0.9))
    assert _store(cache, "What is a monad?")
    assert cache.lookup("please What is a monad?", SCOPE).outcome == "cached"  # the cache's own: direct
    assert cache.lookup("please What is a monad?", SCOPE, CacheConfig("verify")).outcome == "verified"
    off = cache.lookup("What is a monad?", SCOPE, CacheConfig("off"))
    assert off.outcome == "miss" and off.reason == "cache is off"  # "off" looks nothing up, even an exact match


def test_invalid_settings_are_rejected(tmp_path):
    for settings in (dict(mode="yolo"), dict(threshold=0.0), dict(threshold=1.5)):
        with pytest.raises(InvalidSettingError):  # where a mode and threshold are made: the cache never sees them
            SemanticCache(tmp_path / "c", HashEmbedder(8), config=CacheConfig(**settings))
    for kwargs in (dict(ttl_s=0), dict(size_limit_bytes=0)):
        with pytest.raises(InvalidSettingError):
            SemanticCache(tmp_path / "c", HashEmbedder(8), **kwargs)
    assert np.allclose(np.linalg.norm(HashEmbedder(8).encode(["a", "b"]), axis=1), 1.0)
