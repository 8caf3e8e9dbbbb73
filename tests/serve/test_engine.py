"""The engine on its own: settings validated once, safe under threads, final text = streamed text."""
import math
from dataclasses import replace
import threading

import pytest

from engine.config import PROPOSER_NAMES, CacheConfig, SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.events import final_done
from engine.proposers import PROPOSERS
from engine.chat_engine import ChatEngine
from engine.decode.stream import TokenStream
from tests.helpers.tiny import tiny_pair

NAN = math.nan


# -- settings: types and ranges, checked once in engine/config.py -------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    (dict(seed="abc"), "seed"), (dict(seed=2**70), "seed"), (dict(seed=-1), "seed"), (dict(seed=True), "seed"),
    (dict(seed=3.0), "seed"), (dict(top_k=2.5), "top_k"), (dict(top_k=True), "top_k"), (dict(top_k=-1), "top_k"),
    (dict(max_new_tokens=3.5), "max_new_tokens"), (dict(max_new_tokens=True), "max_new_tokens"),
    (dict(max_new_tokens=0), "max_new_tokens"), (dict(temperature="0.5"), "temperature"),
    (dict(temperature=NAN), "temperature"), (dict(temperature=math.inf), "temperature"),
    (dict(temperature=True), "temperature"), (dict(top_p=NAN), "top_p"), (dict(top_p=0.0), "top_p"),
    (dict(stop_on_eos="yes"), "stop_on_eos"), (dict(candidates=21), "candidates"), (dict(candidates=-1), "candidates"),
    (dict(candidates=True), "candidates"), (dict(candidates=2.0), "candidates"),
])
def test_sampling_config_rejects_bad_types_and_ranges(kwargs, field):
    with pytest.raises(InvalidSettingError, match=field) as err:
        SamplingConfig(**kwargs)
    assert err.value.setting == field  # named, so that an API can name its own parameter


@pytest.mark.parametrize("kwargs, field", [
    (dict(k=True), "k"), (dict(k=2.5), "k"), (dict(k=0), "k"), (dict(proposer="oracle"), "proposer"),
    (dict(adaptive="yes"), "adaptive"), (dict(k_min=NAN), "k_min"), (dict(k_max="3"), "k_max"),
    (dict(k_min=5, k_max=2), "k_min <= k_max"),
])
def test_spec_config_rejects_bad_types_and_ranges(kwargs, field):
    with pytest.raises(InvalidSettingError, match=field):
        SpecConfig(**kwargs)


@pytest.mark.parametrize("kwargs", [dict(mode="sometimes"), dict(mode=None), dict(threshold=NAN),
                                    dict(threshold="0.8"), dict(threshold=True), dict(threshold=0.0)])
def test_cache_config_rejects_bad_modes_and_thresholds(kwargs):
    with pytest.raises(InvalidSettingError, match="cache"):
        CacheConfig(**kwargs)


def test_valid_edges_are_accepted():
    assert SamplingConfig(seed=2**63 - 1, temperature=1, top_k=40).seed == 2**63 - 1
    assert SamplingConfig(candidates=0).candidates == 0 and SamplingConfig(candidates=20).candidates == 20
    assert SpecConfig(k=64, k_max=64).k == 64 and CacheConfig("direct", 1.0).threshold == 1.0
    assert set(PROPOSER_NAMES) == set(PROPOSERS)  # names the app offers without importing torch


# -- final text ----------------------------------------------------------------------------------------------
class Utf8Bytes:
    """Token id = one byte; decoding replaces an incomplete character with U+FFFD, like real tokenizers."""

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return bytes(ids).decode("utf-8", errors="replace")


class SpecialBytes(Utf8Bytes):
    """Bytes, with 0 as the end token and 1 as another special token; decode hides them unless asked."""
    all_special_ids = [0, 1]
    NAMES = {0: "<|im_end|>", 1: "<|im_start|>"}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join("" if skip_special_tokens else self.NAMES[i] if i in self.NAMES else chr(i) for i in ids)


@pytest.mark.parametrize("stop_on_eos", [True, False])
def test_a_rejected_special_draft_token_is_named_and_marked(stop_on_eos):
    stream = TokenStream(SpecialBytes(), frozenset({0}), 10, stop_on_eos=stop_on_eos)
    ended = stream.emit(ord("a"), "corrected", 0, rejected_token_id=0)
    other = stream.emit(ord("b"), "corrected", 1, rejected_token_id=1)
    plain = stream.emit(ord("c"), "corrected", 2, rejected_token_id=ord("x"))
    assert (ended.rejected_text, ended.rejected_special) == ("<|im_end|>", "end")
    assert (other.rejected_text, other.rejected_special) == ("<|im_start|>", "control")
    assert (plain.rejected_text, plain.rejected_special) == ("x", None)


@pytest.mark.parametrize("text", ["ok 🎉 done", "שלום עולם"])
def test_done_text_is_the_streamed_text_when_the_limit_cuts_a_character(text):
    data = text.encode()
    for limit in range(1, len(data) + 1):
        stream = TokenStream(Utf8Bytes(), frozenset(), limit, stop_on_eos=False)
        pieces = [event.text for event in (stream.emit(b, "plain", 0) for b in data) if event is not None]
        done = stream.done(None)
        assert done.text == "".join(pieces) and "\ufffd" not in done.text and text.startswith(done.text)
        assert done.finish_reason == "length" and len(done.token_ids) == limit


# -- threads -------------------------------------------------------------------------------------------------
GREEDY = SamplingConfig(max_new_tokens=16, stop_on_eos=False)
SPEC = SpecConfig(k=3)
PROMPTS = ("first question", "second question")


def ask(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]


def single_threaded_answers(pair) -> dict[str, tuple[int, ...]]:
    engine = ChatEngine()
    engine.use_models(*pair)
    return {p: final_done(engine.generate(ask(p), GREEDY, SPEC)).token_ids for p in PROMPTS}


def switch_in_another_thread(engine: ChatEngine, pair) -> None:
    """Install ``pair`` from another thread and wait for it: a switch that waited for a paused generation would
    never finish (its generation is paused in this thread), so it fails here instead of hanging."""
    switcher = threading.Thread(target=engine.use_models, args=pair, daemon=True)
    switcher.start()
    switcher.join(timeout=120)
    assert not switcher.is_alive(), "the pair switch waited for a generation"


def test_a_pair_switch_lands_mid_answer_and_no_answer_mixes_pairs():
    """Two answers are paused mid-answer (each has yielded tokens: it has read its pair), the pair is switched,
    then both resume: each must finish on the pair it started with, while a request made after the switch gets
    the new pair. It fails if the switch waits for generations, or if a generation re-reads the pair per step."""
    pairs = {"a": tiny_pair(0), "b": tiny_pair(7)}
    expected = {name: single_threaded_answers(pair) for name, pair in pairs.items()}
    assert all(expected["a"][p] != expected["b"][p] for p in PROMPTS)  # else the test could not tell them apart
    engine = ChatEngine()
    engine.use_models(*pairs["a"])
    paused = {p: engine.generate(ask(p), GREEDY, SPEC) for p in PROMPTS}
    heads = {p: [next(events) for _ in range(4)] for p, events in paused.items()}  # cache event, then tokens
    assert all(sum(e.type == "token" for e in head) >= 2 for head in heads.values())  # mid-answer, not before it

    switch_in_another_thread(engine, pairs["b"])
    after_switch = engine.generate(ask(PROMPTS[0]), GREEDY, SPEC)
    after_head = [next(after_switch) for _ in range(4)]  # paused too, on the new pair
    assert final_done(engine.generate(ask(PROMPTS[1]), GREEDY, SPEC)).token_ids == expected["b"][PROMPTS[1]]

    switch_in_another_thread(engine, pairs["a"])  # and back, while the new pair's answer is paused
    resumed = {p: final_done([*heads[p], *events]).token_ids for p, events in paused.items()}
    assert resumed == {p: expected["a"][p] for p in PROMPTS}  # started on pair a, finished on pair a
    assert final_done([*after_head, *after_switch]).token_ids == expected["b"][PROMPTS[0]]
    assert final_done(engine.generate(ask(PROMPTS[0]), GREEDY, SPEC)).token_ids == expected["a"][PROMPTS[0]]


def test_generations_in_threads_each_answer_from_one_pair_while_the_pair_switches():
    """The same across threads: two chats pause mid-answer (each waits until the switch has landed), the switch
    lands, the chats resume; every wait's result is checked, so a switch that never lands fails the test."""
    pairs = {"a": tiny_pair(0), "b": tiny_pair(7)}
    expected = {name: single_threaded_answers(pair) for name, pair in pairs.items()}
    engine = ChatEngine()
    engine.use_models(*pairs["a"])
    paused = threading.Barrier(len(PROMPTS) + 1, timeout=120)  # both chats mid-answer, and the switcher
    switched = threading.Event()
    results, errors = {}, []

    def chat(prompt: str) -> None:
        try:
            events = engine.generate(ask(prompt), GREEDY, SPEC)
            head = [next(events) for _ in range(4)]  # cache event, tokens: the request has read its pair
            paused.wait()
            assert switched.wait(timeout=120), "the switch never landed"
            results[prompt] = final_done([*head, *events]).token_ids
        except Exception as err:  # reported below, with the thread's traceback
            errors.append(err)

    chats = [threading.Thread(target=chat, args=(p,)) for p in PROMPTS]
    for t in chats:
        t.start()
    paused.wait()
    switch_in_another_thread(engine, pairs["b"])
    switched.set()
    for t in chats:
        t.join(timeout=300)
    assert not errors, errors
    assert results == {p: expected["a"][p] for p in PROMPTS}
    assert {p: final_done(engine.generate(ask(p), GREEDY, SPEC)).token_ids for p in PROMPTS} == expected["b"]


def test_a_paused_generation_does_not_block_another_in_the_same_thread():
    """The engine lock is never held across a yield: no call order can deadlock (e.g. measuring a baseline
    while a chat generator is open)."""
    pair = tiny_pair(3)
    expected = single_threaded_answers(pair)
    engine = ChatEngine()
    engine.use_models(*pair)
    outcome = {}

    def interleave() -> None:
        paused = engine.generate(ask(PROMPTS[0]), GREEDY, SPEC)
        head = [next(paused) for _ in range(3)]
        outcome["other"] = final_done(engine.generate(ask(PROMPTS[1]), GREEDY, SPEC)).token_ids
        outcome["reference"] = final_done(engine.generate_reference(ask(PROMPTS[1]), GREEDY)).token_ids
        outcome["paused"] = final_done([*head, *paused]).token_ids

    worker = threading.Thread(target=interleave, daemon=True)
    worker.start()
    worker.join(timeout=300)
    assert not worker.is_alive(), "deadlock: a paused generation kept the engine lock"
    assert outcome == {"other": expected[PROMPTS[1]], "reference": expected[PROMPTS[1]],
                       "paused": expected[PROMPTS[0]]}


def test_cancel_ends_an_engine_generation_with_the_cancelled_reason():
    """The reader cancels after its second step; the decode, which runs ahead on its worker, stops at the step
    it reaches next, before its room runs out, and every step it took reached the reader."""
    engine = ChatEngine()
    engine.use_models(*tiny_pair(1))
    cancel = threading.Event()
    events = engine.generate(ask("stop me"), SamplingConfig(max_new_tokens=1000, stop_on_eos=False), SPEC,
                             cancel=cancel)
    steps = 0
    for event in events:
        if event.type == "stats":
            steps += 1
            if steps == 2:
                cancel.set()
    assert event.type == "done" and event.finish_reason == "cancelled"
    assert event.stats.acceptance.steps == steps  # "cancelled", not "length": it stopped before the room ran out


def test_a_stop_string_ends_the_decode_in_the_step_that_completes_it():
    """The engine applies stop strings (SamplingConfig.stop): the token that completes one is the answer's last,
    so nothing is decoded past it even when the reader is far behind; the answer is the plain answer's prefix."""
    engine = ChatEngine()
    engine.use_models(*tiny_pair(5))
    sampling = SamplingConfig(max_new_tokens=60, stop_on_eos=False)
    full = final_done(engine.generate(ask("stop strings"), sampling, SPEC))
    middle = len(full.text) // 2
    stop = full.text[middle:middle + 3]
    assert stop and full.text.find(stop) < len(full.text) - 3
    events = list(engine.generate(ask("stop strings"), replace(sampling, stop=(stop,)), SPEC))
    texts, done = [e.text for e in events if e.type == "token"], events[-1]
    assert done.finish_reason == "stop" and stop in "".join(texts) and stop not in "".join(texts[:-1])
    assert done.token_ids == full.token_ids[:len(done.token_ids)] and len(done.token_ids) < len(full.token_ids)


@pytest.mark.parametrize("stop", [("",), ("x",) * 5, ("x" * 257,), ["x"], (1,)])
def test_sampling_config_refuses_bad_stop_strings(stop):
    with pytest.raises(InvalidSettingError) as err:
        SamplingConfig(stop=stop)
    assert err.value.setting == "stop"
