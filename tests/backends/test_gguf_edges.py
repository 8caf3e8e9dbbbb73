"""The llama.cpp runner's edges, through the engine, on the real SmolLM2 GGUF (precision gguf, the path auto gives a
CPU user): a prompt beyond the context, an answer that runs into the context's end, two chats at once, cancel then
the same prompt, a damaged file, a pair whose vocabularies differ, and a pair switch while a chat streams.

A small context (256 tokens) makes the context's end reachable in a fast test. "Fresh" means a new GgufModel, so a
new pool of contexts that no earlier request filled.
"""
from __future__ import annotations

import dataclasses
import shutil
import threading

import pytest

from engine.backends.llama_cpp import GgufModel, GgufSettings
from engine.chat_engine import ChatEngine
from engine.config import CACHE_OFF, SamplingConfig, SpecConfig
from engine.errors import EngineError, IncompatiblePairError, ModelFormatError, PromptTooLongError
from engine.events import final_done
from engine.models.catalog import DEFAULT_DRAFT
from engine.models.loading import load_model
from engine.models.sources import gguf_file
from tests.helpers.constants import SMOL

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("llama_cpp")]

CTX = 256
GREEDY = SamplingConfig(max_new_tokens=40)
SPEC = SpecConfig(k=4, proposer="draft")  # a fixed k: the verify widths do not depend on timing
PROMPT = "Name three colours of the rainbow."
OTHER = "Write a haiku about the sea."


def small_context(loaded):
    """``loaded`` on a new GgufModel (its own pool of contexts) whose contexts hold ``CTX`` tokens."""
    backend = GgufModel(loaded.backend.path, GgufSettings(n_ctx=CTX))
    return dataclasses.replace(loaded, backend=backend, context_window=backend.n_ctx)


@pytest.fixture(scope="module")
def smol():
    return load_model(SMOL, "gguf")


def fresh_engine(smol) -> ChatEngine:
    engine = ChatEngine(measure_beside=False)
    model = small_context(smol)
    engine.use_models(model, model)
    return engine


def ask(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def answer(engine: ChatEngine, text: str, sampling: SamplingConfig = GREEDY):
    return final_done(engine.generate(ask(text), sampling, SPEC, cache=CACHE_OFF))


def pooled_contexts_agree(engine: ChatEngine) -> bool:
    """Every idle context of the target's pool holds in llama.cpp's KV cache exactly the tokens its list says."""
    backend = engine.target.backend
    lib = backend.lib
    return all(lib.llama_memory_seq_pos_max(lib.llama_get_memory(ctx), 0) + 1 == len(tokens)
               for ctx, _, tokens, _ in backend._idle)


def test_a_small_context_loads_and_measures_identity_where_it_fits(smol):
    """The load-time identity check measured a position past a 256-token context and crashed the load; it now
    checks the positions that fit, and says which."""
    info = fresh_engine(smol).info()
    assert info.identity_note.endswith("positions 24)"), info.identity_note


def test_a_prompt_longer_than_the_context_is_refused_and_the_engine_answers_the_next(smol):
    engine = fresh_engine(smol)
    with pytest.raises(PromptTooLongError, match=f"{CTX:,} tokens"):
        answer(engine, "word " * (2 * CTX))
    assert answer(engine, PROMPT).token_ids == answer(fresh_engine(smol), PROMPT).token_ids


def test_an_answer_that_runs_into_the_contexts_end_stops_there_and_leaves_nothing_behind(smol):
    engine = fresh_engine(smol)
    prompt_ids = engine.encode(ask(OTHER))
    endless = SamplingConfig(max_new_tokens=4 * CTX, stop_on_eos=False)  # only the context can end it
    done = answer(engine, OTHER, endless)
    assert done.finish_reason == "length" and len(done.token_ids) == CTX - len(prompt_ids)
    assert pooled_contexts_agree(engine)
    # the next requests, one of them the same prompt, read nothing of the full context but its valid prefix
    assert answer(engine, PROMPT).token_ids == answer(fresh_engine(smol), PROMPT).token_ids
    assert answer(engine, OTHER).token_ids == answer(fresh_engine(smol), OTHER).token_ids


def test_two_chats_at_once_each_get_their_solo_answer(smol):
    solo = {p: answer(fresh_engine(smol), p).token_ids for p in (PROMPT, OTHER)}
    engine = fresh_engine(smol)
    started = threading.Barrier(2, timeout=120)
    results, errors = {}, []

    def chat(prompt: str) -> None:
        try:
            events = engine.generate(ask(prompt), GREEDY, SPEC, cache=CACHE_OFF)
            head = [next(events) for _ in range(3)]  # both mid-answer before either goes on: steps interleave
            started.wait()
            results[prompt] = final_done([*head, *events]).token_ids
        except Exception as err:  # reported below
            errors.append(err)

    threads = [threading.Thread(target=chat, args=(p,)) for p in solo]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    assert results == solo
    assert pooled_contexts_agree(engine)


def test_cancel_then_the_same_prompt_gives_a_fresh_answer(smol):
    engine = fresh_engine(smol)
    cancel = threading.Event()
    events = engine.generate(ask(PROMPT), GREEDY, SPEC, cache=CACHE_OFF, cancel=cancel)
    head = [next(events) for _ in range(4)]
    cancel.set()
    done = final_done([*head, *events])
    assert done.finish_reason == "cancelled" and len(done.token_ids) < GREEDY.max_new_tokens
    assert answer(engine, PROMPT).token_ids == answer(fresh_engine(smol), PROMPT).token_ids


@pytest.mark.parametrize("damage", ["truncated", "not gguf"])
def test_a_damaged_gguf_file_is_refused_with_a_sentence_and_the_pair_stays(smol, tmp_path, damage):
    path = tmp_path / "damaged.gguf"
    if damage == "truncated":
        with open(gguf_file(SMOL), "rb") as src:
            path.write_bytes(src.read(1 << 20))  # the header and part of the tensor data
    else:
        path.write_text("this is a text file, not a model\n")
    engine = fresh_engine(smol)
    before = engine.info()
    with pytest.raises(ModelFormatError, match=str(path.name)) as refused:
        engine.load_pair(str(path), str(path), "gguf", "gguf")
    assert "\n" not in str(refused.value) and "Traceback" not in str(refused.value)
    assert engine.info() == before and answer(engine, PROMPT).finish_reason in ("eos", "length")


def test_a_gguf_pair_whose_vocabularies_differ_is_refused_before_loading(smol):
    engine = fresh_engine(smol)
    with pytest.raises(IncompatiblePairError, match="tokenize differently"):
        engine.load_pair(SMOL, DEFAULT_DRAFT, "gguf", "gguf")
    assert engine.info().target == SMOL


def test_a_second_pair_loaded_while_a_chat_streams_leaves_the_chat_on_its_pair(smol, tmp_path):
    """The chat started on the 256-token pair finishes on it (its answer is that pair's solo answer) while the new
    pair, a copy of SmolLM2's file at its full context, serves the requests made after the switch."""
    engine = fresh_engine(smol)
    solo = answer(fresh_engine(smol), PROMPT).token_ids
    events = engine.generate(ask(PROMPT), GREEDY, SPEC, cache=CACHE_OFF)
    head = [next(events) for _ in range(4)]
    copy = tmp_path / "smol-copy.gguf"  # another file: the switch cannot reuse the loaded model
    shutil.copyfile(gguf_file(SMOL), copy)
    try:
        info = engine.load_pair(str(copy), str(copy), "gguf", "gguf")
    except EngineError as err:  # a user's GGUF file converts once: only a missing piece may stop it here
        pytest.fail(f"the second pair did not load: {err}")
    assert info.target == info.draft == str(copy) and engine.target.context_window > CTX
    assert final_done([*head, *events]).token_ids == solo
    assert answer(engine, PROMPT).finish_reason in ("eos", "length")
