"""The semantic cache in front of the real engine: exact, verified (cache as draft) and direct paths."""
import threading

import pytest

from engine.config import CACHE_OFF, SamplingConfig, SpecConfig
from engine.cache.embedder import load_default_embedder
from engine.cache.semantic_cache import SemanticCache
from engine.session import ChatEngine

pytestmark = pytest.mark.real
SMOL = "smollm2-135m-instruct"
GREEDY = SamplingConfig(max_new_tokens=160)
SPEC = SpecConfig(k=4)


@pytest.fixture(scope="module")
def loaded():
    engine = ChatEngine()
    engine.load_pair(SMOL, SMOL, "fp32", "bf16")
    return engine.target, engine.draft


@pytest.fixture
def engine(loaded, tmp_path):
    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", load_default_embedder()))
    engine.use_models(*loaded)
    return engine


def ask(engine, prompt, **kwargs):
    events = list(engine.generate([{"role": "user", "content": prompt}], GREEDY, SPEC, **kwargs))
    assert events[0].type == "cache" and events[-1].type == "done"
    return events


def reference(engine, prompt):
    return list(engine.generate_reference([{"role": "user", "content": prompt}], GREEDY))[-1]


def test_miss_then_exact_hit_replays_the_same_answer_as_cached_tokens(engine):
    first = ask(engine, "In one short sentence, what is a Python list?")
    assert first[0].outcome == "miss" and first[-1].finish_reason == "eos"
    again = ask(engine, "in one short sentence,  what is a python list")
    assert again[0].outcome == "exact" and again[0].matched_prompt == "In one short sentence, what is a Python list?"
    assert again[-1].token_ids == first[-1].token_ids and again[-1].text == first[-1].text
    assert {e.kind for e in again if e.type == "token"} == {"cached"}


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
    assert done.stats.steps < len(done.token_ids) / 2  # whole chunks of the cached answer were accepted
    assert first[-1].stats.steps > done.stats.steps


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
