"""Verify means verify: a wrong answer planted under an exact key, on disk or in a real
Redis, never reaches the user unchecked. In verify mode the target checks an exact hit as one draft: served as
``cached`` only when it accepts every token, otherwise corrected (and the entry dropped or replaced). Direct
mode serves exact hits as they are only from a store it trusts: the user's own directory, or any store whose
records carry a valid HMAC under the secret the instances share; other records are refused with a warning.
Tiny random models: the target's own answer is the reference, whatever it is. Their step costs are fixed
(``LAB_COSTS``) rather than timed at load: a cached answer is a free draft priced on those costs, and a tiny model
timed on a busy machine can price it down to a couple of tokens a step, which moves the correction elsewhere."""
import hashlib
import logging

import diskcache
import pytest

from engine.cache.cached_chat import chat_scope
from engine.cache.semantic_cache import SemanticCache, entry_key, make_scope
from engine.chat_engine import ChatEngine
from engine.config import CacheConfig, SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.events import final_done
from tests.helpers.fakes import LAB_COSTS
from tests.helpers.tiny import tiny_pair
from tests.helpers.embedders import PrefixBlindEmbedder

SECRET = "a secret the instances share"
GREEDY = SamplingConfig(max_new_tokens=12)
SPEC = SpecConfig(k=4)
PROMPT = "what does the tiny model say?"


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(0)


@pytest.fixture(autouse=True)
def fixed_step_costs(monkeypatch):
    monkeypatch.setattr("engine.serve.measuring.measure_step_costs", lambda target, draft, step: (LAB_COSTS, 0.0))


@pytest.fixture(scope="module")
def trust_redis():
    """One real server for the trust tests (Redis 8.2: the vector-set path; the signatures do not depend on it)."""
    from tests.helpers.redis_server import RedisServer
    server = RedisServer("redis8").start()
    try:
        yield server
    finally:
        server.stop()


def location(kind, request, tmp_path):
    if kind == "disk":
        return tmp_path / "cache"
    server = request.getfixturevalue("trust_redis")
    return f"{server.url}#{hashlib.sha256(request.node.name.encode()).hexdigest()[:16]}"


def open_cache(where, secret=None, mode="verify"):
    """A SemanticCache on ``where``: a directory, or ``<redis url>#<namespace>``."""
    if isinstance(where, str) and "#" in where:
        from engine.cache.redis_store import RedisStore

        url, namespace = where.split("#")
        return SemanticCache(RedisStore(url, namespace=namespace), PrefixBlindEmbedder(), config=CacheConfig(mode),
                             secret=secret)
    return SemanticCache(where, PrefixBlindEmbedder(), config=CacheConfig(mode),
                             secret=secret)


def engine_on(pair, cache) -> ChatEngine:
    engine = ChatEngine(cache=cache)
    engine.use_models(*pair)
    return engine


def ask(engine, mode):
    events = list(engine.generate([{"role": "user", "content": PROMPT}], GREEDY, SPEC, cache=CacheConfig(mode)))
    return events[0], [e for e in events if e.type == "token"], events[-1]


def plant(where, engine, token_ids, secret=None):
    """Another writer stores ``token_ids`` as the answer to PROMPT (exact key, same scope)."""
    scope = chat_scope(engine.target, GREEDY, [{"role": "user", "content": PROMPT}])
    with open_cache(where, secret) as planter:
        assert planter.store(PROMPT, scope, "planted", token_ids, complete=True)
    return entry_key(scope, PROMPT)


def reference(engine):
    return list(final_done(engine.generate_reference([{"role": "user", "content": PROMPT}], GREEDY)).token_ids)


def wrong(ids):
    return [*ids[:2], 1 + ids[2] % 40, *ids[3:]]


# (store, mode, the reader's secret, the planter's secret) -> what the user gets
@pytest.mark.parametrize("kind, mode, secret, planter_secret, expected", [
    ("disk", "verify", None, None, "corrected"),
    ("disk", "direct", None, None, "served"),  # the user's own directory: trusted as it is
    ("disk", "direct", SECRET, None, "refused"),  # unsigned
    ("disk", "verify", SECRET, "another secret of the same length", "refused"),  # signed with another key
    ("redis", "verify", None, None, "corrected"),
    ("redis", "direct", None, None, "corrected"),  # shared, no secret: the target checks every hit
    ("redis", "direct", SECRET, None, "refused"),
    ("redis", "direct", SECRET, "another secret of the same length", "refused"),
])
def test_a_planted_wrong_answer_under_an_exact_key(pair, request, tmp_path, caplog, kind, mode, secret,
                                                   planter_secret, expected):
    where = location(kind, request, tmp_path)
    engine = engine_on(pair, open_cache(where, secret, mode))
    truth = reference(engine)
    key = plant(where, engine, wrong(truth), planter_secret)
    with caplog.at_level(logging.WARNING, logger="engine.cache"):
        event, tokens, done = ask(engine, mode)
    if expected == "served":
        assert event.outcome == "exact" and list(done.token_ids) == wrong(truth)
        assert {t.kind for t in tokens} == {"cached"} and done.stats.acceptance.steps == 0
        return
    assert list(done.token_ids) == truth and "cached" not in {t.kind for t in tokens}
    if expected == "refused":
        assert event.outcome == "miss" and f"entry {key} refused: its signature does not check" in caplog.text
    else:
        assert event.outcome == "verified" and "disagrees with the cached answer at token 3" in event.reason
        assert [t.kind for t in tokens][2] == "corrected" and done.stats.acceptance.steps >= 1
        with open_cache(where) as reader:  # refuted inside its answer, nothing complete to replace it: gone
            assert reader.lookup(PROMPT, event_scope(engine), CacheConfig("direct")).outcome == "miss"


def event_scope(engine):
    return chat_scope(engine.target, GREEDY, [{"role": "user", "content": PROMPT}])


@pytest.mark.parametrize("kind, mode, secret", [("disk", "verify", None), ("redis", "verify", None),
                                                ("redis", "direct", None), ("redis", "direct", SECRET)])
def test_a_right_answer_under_an_exact_key_is_served(pair, request, tmp_path, kind,
                                                                               mode, secret):
    where = location(kind, request, tmp_path)
    engine = engine_on(pair, open_cache(where, secret, mode))
    truth = reference(engine)
    plant(where, engine, truth, secret)
    event, tokens, done = ask(engine, mode)
    assert event.outcome == "exact" and list(done.token_ids) == truth and {t.kind for t in tokens} == {"cached"}
    assert done.stats.acceptance.steps == 0 and done.stats.proposer == "cache"  # checked in one forward, or trusted


def test_a_signed_record_moved_under_another_prompts_key_is_refused(tmp_path, caplog):
    scope = make_scope("tiny-target", "fp32", GREEDY, "", [])
    with open_cache(tmp_path / "c", SECRET, "direct") as cache:
        assert cache.store("the real question", scope, "its answer", [5, 6], complete=True)
        planter = diskcache.Cache(str(tmp_path / "c"))  # copies the signed record under another prompt's key
        planter.set("e:" + entry_key(scope, "another question"),
                    planter.get("e:" + entry_key(scope, "the real question")), tag="entry")
        planter.close()
        with caplog.at_level(logging.WARNING, logger="engine.cache"):
            assert cache.lookup("another question", scope).outcome == "miss"
        assert "sits under another prompt's key" in caplog.text
        assert cache.lookup("the real question", scope).answer == "its answer"


@pytest.mark.parametrize("secret", ["", "short", b"15 bytes only!!"])
def test_a_short_secret_is_refused(tmp_path, secret):
    with pytest.raises(InvalidSettingError, match="at least 16 bytes"):
        open_cache(tmp_path / "c", secret)


def test_launch_takes_the_secret_from_the_environment_or_a_file_and_refuses_a_short_one(monkeypatch, tmp_path,
                                                                                         capsys):
    import engine.cache.embedder
    import launch
    from engine.cache.embedder import HashEmbedder

    monkeypatch.setenv("SPECLENS_CACHE_SECRET", SECRET)
    assert launch.parse_args([]).cache_secret == SECRET
    (tmp_path / "secret").write_text("from a file, long enough\nsecond line\n")
    assert launch.parse_args(["--cache-secret-file", str(tmp_path / "secret")]).cache_secret == \
        "from a file, long enough"
    with pytest.raises(SystemExit):
        launch.parse_args(["--cache-secret-file", str(tmp_path / "missing")])
    assert "--cache-secret-file " + str(tmp_path / "missing") in capsys.readouterr().err
    monkeypatch.setattr(engine.cache.embedder, "load_default_embedder", HashEmbedder)
    with pytest.raises(SystemExit, match="at least 16 bytes"):
        launch.open_semantic_cache(tmp_path, secret="short")
