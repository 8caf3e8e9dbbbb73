"""The semantic cache in front of the real engine: exact, verified (cache as draft) and direct paths."""
import threading

import pytest

from engine.config import CACHE_OFF, CacheConfig, SamplingConfig, SpecConfig
from engine.cache.embedder import load_default_embedder
from engine.cache.semantic_cache import SemanticCache
from engine.chat_engine import ChatEngine
from tests.helpers.redis_server import wait_until
from tests.helpers.constants import SMOL
from tests.helpers.pooled import use_pooled

pytestmark = pytest.mark.real
GREEDY = SamplingConfig(max_new_tokens=160)
SHORT = SamplingConfig(max_new_tokens=48)  # the shared-Redis cases: the same decode on each server and secret
SPEC = SpecConfig(k=4)


@pytest.fixture(scope="module")
def loaded(real_models):
    return real_models.model(SMOL, "fp32"), real_models.model(SMOL, "bf16")


@pytest.fixture
def engine(loaded, tmp_path):
    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", load_default_embedder()))
    use_pooled(engine, *loaded)
    return engine


def ask(engine, prompt, sampling=GREEDY, **kwargs):
    events = list(engine.generate([{"role": "user", "content": prompt}], sampling, SPEC, **kwargs))
    assert events[0].type == "cache" and events[-1].type == "done"
    return events


REFERENCES: dict[tuple[int, str, int], object] = {}  # (target's id, prompt, length) -> its greedy target-only answer


def reference(engine, prompt, sampling=GREEDY):
    """The target-only answer, decoded once per target, prompt and length (greedy: every test that compares with the
    same prompt's gets the same tokens; the models live in the session's pool, so their ids are not reused)."""
    key = (id(engine.target), prompt, sampling.max_new_tokens)
    if key not in REFERENCES:
        REFERENCES[key] = list(engine.generate_reference([{"role": "user", "content": prompt}], sampling))[-1]
    return REFERENCES[key]


def test_miss_then_exact_hit_replays_the_same_answer_as_cached_tokens(engine):
    first = ask(engine, "In one short sentence, what is a Python list?")
    assert first[0].outcome == "miss" and first[-1].finish_reason == "eos"
    variant = "in one short sentence,  what is a python list"
    again = ask(engine, variant, cache=CacheConfig("direct"))  # the user's own directory: served as it is
    assert again[0].outcome == "exact" and again[0].matched_prompt == "In one short sentence, what is a Python list?"
    assert again[-1].token_ids == first[-1].token_ids and again[-1].text == first[-1].text
    assert {e.kind for e in again if e.type == "token"} == {"cached"}
    checked = ask(engine, variant)  # verify mode: the target checks the cached answer against this very text
    assert checked[0].outcome in ("exact", "verified")
    assert checked[-1].token_ids == reference(engine, variant).token_ids


WRONG = "def add(a, b):\n    return a - b  # deliberately wrong\n"


def _plant(cache, engine, prompt, text=WRONG):
    """Another writer puts ``text`` under the exact key of ``prompt`` (same scope)."""
    ids = engine.target.tokenizer(text, add_special_tokens=False)["input_ids"]
    assert cache.store(prompt, _scope(engine, prompt), text, ids, complete=True)


def test_a_wrong_exact_hit_is_corrected_replaced_and_then_served_after_one_forward(engine):
    """Verify mode on the user's directory: the target checks an exact hit, corrects it, the corrected answer
    replaces it; the next time the whole answer is accepted in one target forward and served as cached."""
    prompt = "In one short sentence, what is a Python tuple?"
    _plant(engine.cache, engine, prompt)
    truth = reference(engine, prompt)
    assert truth.finish_reason == "eos"  # a complete answer: the corrected one replaces the planted one
    first = ask(engine, prompt)
    assert first[0].outcome == "verified" and "disagrees with the cached answer" in first[0].reason
    assert first[-1].token_ids == truth.token_ids and "a - b" not in first[-1].text
    again = ask(engine, prompt)
    assert again[0].outcome == "exact" and again[-1].token_ids == truth.token_ids
    assert {e.kind for e in again if e.type == "token"} == {"cached"} and again[-1].stats.acceptance.steps == 0


def test_a_bf16_target_serves_its_own_answer_again_despite_rounding_ties(real_models, tmp_path):
    """int8-weight computes in bf16: checking a whole answer in one forward rounds differently from the decode
    that wrote it, and re-decided ties at low-confidence tokens (p 0.33 vs the cached one); a tie is not a
    disagreement."""
    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", load_default_embedder()))
    # the draft is not what this is about: the pair test_identity_check measures, whose figures the pooled models keep
    use_pooled(engine, real_models.model(SMOL, "int8-weight"), real_models.model(SMOL, "int8-dynamic"))
    prompt = "Reply with just the word yes."
    first = ask(engine, prompt)
    assert first[0].outcome == "miss" and first[-1].finish_reason == "eos"
    again = ask(engine, prompt)  # verify mode
    assert again[0].outcome == "exact" and again[-1].token_ids == first[-1].token_ids
    assert {e.kind for e in again if e.type == "token"} == {"cached"}


@pytest.mark.parametrize("secret", [None, "a secret the instances share"])
def test_a_wrong_exact_hit_in_a_shared_redis_is_never_served_in_direct_mode(loaded, redis_server, secret):
    """Without a secret the target checks every hit from a shared store; with one, an unsigned record is
    refused."""
    from engine.cache.redis_store import RedisStore

    def cache(signing):
        return SemanticCache(RedisStore(redis_server.url, namespace=f"shared-{secret is None}"),
                             load_default_embedder(), secret=signing)
    engine = ChatEngine(cache=cache(secret))
    use_pooled(engine, *loaded)
    prompt = "Write a Python function that adds two numbers."
    _plant(cache(None), engine, prompt)
    # 48 tokens hold the answer's function; the planted answer is 20 (served, it would be the whole answer)
    events = ask(engine, prompt, SHORT, cache=CacheConfig("direct"))
    assert events[0].outcome == ("verified" if secret is None else "miss")
    assert events[-1].token_ids == reference(engine, prompt, SHORT).token_ids and "a - b" not in events[-1].text


def test_verified_path_returns_the_target_answer_even_when_the_cached_answer_is_wrong(engine):
    prompt = "Write a Python function that adds two numbers."
    paraphrase = "Write a Python function which adds two numbers."
    tokenizer = engine.target.tokenizer
    wrong = "def add(a, b):\n    return a - b  # deliberately wrong\n"
    scope_messages = [{"role": "user", "content": prompt}]
    from engine.cache.cached_chat import chat_scope
    engine.cache.store(prompt, chat_scope(engine.target, GREEDY, scope_messages), wrong,
                       tokenizer(wrong, add_special_tokens=False)["input_ids"], complete=True)
    events = ask(engine, paraphrase)
    assert events[0].outcome == "verified" and events[0].matched_prompt == prompt
    assert events[-1].token_ids == reference(engine, paraphrase).token_ids
    assert "a - b" not in events[-1].text


def test_verified_path_with_a_right_cached_answer_takes_few_steps(engine):
    prompt = "Write a Python function that returns the maximum of a list."
    first = ask(engine, prompt)
    assert first[-1].finish_reason == "eos"  # stored
    paraphrase = "Write a Python function returning the maximum of a list."
    events = ask(engine, paraphrase)
    assert events[0].outcome == "verified"
    done = events[-1]
    assert done.token_ids == reference(engine, paraphrase).token_ids
    assert done.stats.acceptance.steps < len(done.token_ids) / 2  # whole chunks of the cached answer were accepted
    assert first[-1].stats.acceptance.steps > done.stats.acceptance.steps


def test_cancelled_generation_is_not_stored(engine):
    cancel = threading.Event()
    events = []
    for event in engine.generate([{"role": "user", "content": "Tell me about the moon."}], GREEDY, SPEC,
                                 cancel=cancel):
        events.append(event)
        if event.type == "stats":
            cancel.set()
    assert events[-1].finish_reason == "cancelled"
    assert len(engine.cache) == 0
    assert ask(engine, "Tell me about the moon.")[0].outcome == "miss"


def test_truncated_answer_is_not_stored_and_cache_off_skips_lookup(engine):
    events = list(engine.generate([{"role": "user", "content": "Describe the sun in detail."}],
                                  SamplingConfig(max_new_tokens=4), SPEC))
    assert events[-1].finish_reason == "length" and len(engine.cache) == 0
    off = ask(engine, "Describe the sun in detail.", cache=CACHE_OFF)
    assert off[0].outcome == "off"


def test_cache_off_neither_reads_nor_writes(engine):
    stored = "In one short sentence, what is a Python list?"
    engine.cache.store(stored, _scope(engine, stored), "a cached answer", [1, 2], complete=True)
    fresh = "In one short sentence, what is a Python tuple?"
    for prompt in (stored, fresh):
        events = ask(engine, prompt, cache=CACHE_OFF)
        assert events[0].outcome == "off" and not any(e.type == "token" and e.kind == "cached" for e in events)
        assert events[-1].finish_reason == "eos"  # complete: it would have been stored with the cache on
    assert len(engine.cache) == 1  # the answers given with the cache off were not written
    assert ask(engine, fresh)[0].outcome == "miss"


def test_entries_with_token_ids_outside_the_vocabulary_are_skipped(engine):
    vocab = engine.target.vocab_size
    for prompt, mode in (("Say hi.", "verify"), ("Say hi.", "direct")):
        engine.cache.clear()  # only the bad entry: not the answer generated in the previous round
        engine.cache.store(prompt, _scope(engine, prompt), "x", [1, vocab + 7, 2**40], complete=True)
        events = ask(engine, prompt, cache=CacheConfig(mode))  # exact path: would raise OverflowError/IndexError
        assert events[0].outcome == "miss" and events[-1].finish_reason in ("eos", "length")
        assert not any(e.type == "token" and e.kind == "cached" for e in events)


def test_a_failed_cache_write_never_costs_the_answer(loaded, tmp_path, monkeypatch):
    import sqlite3

    import diskcache

    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", load_default_embedder()))
    use_pooled(engine, *loaded)

    def disk_full(*args, **kwargs):
        raise sqlite3.OperationalError("database or disk is full")
    monkeypatch.setattr(diskcache.Cache, "set", disk_full)
    events = ask(engine, "Name a planet.")
    assert events[-1].finish_reason == "eos" and events[-1].text
    assert "disk is full" in engine.cache.stats().warning and len(engine.cache) == 0


def test_redis_killed_during_generation_still_delivers_the_answer(loaded, redis_kind):
    from engine.cache.redis_store import RedisStore
    from tests.helpers.redis_server import RedisServer

    server = RedisServer(redis_kind).start()
    try:
        engine = ChatEngine(cache=SemanticCache(RedisStore(server.url, namespace="gen"), load_default_embedder()))
        use_pooled(engine, *loaded)
        events = []
        for event in engine.generate([{"role": "user", "content": "Name a fruit."}], GREEDY, SPEC):
            events.append(event)
            if event.type == "token" and server.proc is not None:
                server.stop()  # the answer is being generated; its cache write will fail
        assert events[0].outcome == "miss" and events[-1].type == "done" and events[-1].finish_reason == "eos"
        assert "unreachable" in engine.cache.stats().warning
    finally:
        server.stop()


def test_two_engines_on_one_redis8_share_hits_and_a_redis_restart_loses_no_chat(loaded):
    """Two app instances (two ChatEngines, each with its own SemanticCache) on one Redis 8: an answer of one
    is a hit in the other, searched on the server; Redis restarted mid-session (empty): both keep answering,
    and what is written after the restart is shared again."""
    from engine.cache.redis_store import RedisStore
    from tests.helpers.redis_server import RedisServer

    server = RedisServer("redis8").start()
    try:
        # a shared store serves exact hits unchecked only with the instances' shared secret (signed records)
        one, two = (ChatEngine(cache=SemanticCache(RedisStore(server.url, namespace="app", retry_after_s=0.2),
                                                   load_default_embedder(), secret="s" * 32)) for _ in range(2))
        for engine in (one, two):
            use_pooled(engine, *loaded)
        assert one.cache.search.endswith("vector set") and "vector set" in two.cache_info().backend
        first = ask(one, "Name a planet.")
        assert first[0].outcome == "miss" and first[-1].finish_reason == "eos"
        # found in the other instance's entry; verify mode checks an exact hit with the target, so it is served
        # "exact" or, where the target would answer otherwise, corrected as "verified"
        assert ask(two, "name a planet")[0].outcome in ("exact", "verified")
        assert ask(two, "Please name one planet.")[0].outcome in ("verified", "cached")  # semantic, on the server
        server.stop()
        server.start()  # same port, empty
        during = ask(one, "Name a fruit.")
        assert during[-1].finish_reason == "eos" and during[-1].text  # answered, with or without the cache
        wait_until(lambda: ask(one, "Name a colour.")[0].reason == "", 30, "engine one to use Redis again")
        wait_until(lambda: ask(two, "name a colour")[0].outcome in ("exact", "verified"), 30,  # written after the restart
                   "engine two to find engine one's answer")
    finally:
        server.stop()


def _scope(engine, prompt):
    from engine.cache.cached_chat import chat_scope

    return chat_scope(engine.target, GREEDY, [{"role": "user", "content": prompt}])
