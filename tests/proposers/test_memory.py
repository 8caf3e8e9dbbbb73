"""The memory of earlier work (engine/proposers/memory.py): bounded, longest match first, followed while the answer
takes it, one per scope; a remembered answer drafts the next that repeats it, and the answer stays the target's."""
from __future__ import annotations

from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig, SpecConfig
from engine.decode.reference import reference_generate
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.events import final_done
from engine.proposers import NgramProposer
from engine.proposers.memory import KEY, AnswerMemory, MemoryProposer
from tests.helpers.curves import OnThisCurve
from tests.helpers.tiny import budget, cached, run, tiny_pair


def test_the_longest_match_wins_and_the_most_recent_among_equals():
    memory = AnswerMemory()
    memory.add([1, 2, 3, 4, 5, 6, 70, 71])
    memory.add([9, 3, 4, 5, 6, 80, 81])
    memory.add([0, 3, 4, 5, 6, 90, 91])
    text_id, end, n = memory.match([1, 2, 3, 4, 5, 6])
    assert memory.text(text_id, end, 2) == [70, 71] and n == 6  # matched 6 tokens back, not just the key
    text_id, end, n = memory.match([7, 3, 4, 5, 6])
    assert memory.text(text_id, end, 2) == [90, 91] and n == KEY  # ties: the latest text
    assert memory.match([3, 4, 5, 99]) is None


def test_the_memory_is_bounded_drops_the_oldest_and_keeps_a_text_once():
    memory = AnswerMemory(max_tokens=20)
    memory.add(list(range(100, 110)))
    memory.add(list(range(100, 110)))  # seen: kept once
    assert len(memory) == 1 and memory.tokens == 10
    memory.add(list(range(200, 210)))
    memory.add(list(range(300, 310)))  # 30 > 20: the oldest goes, with its index entries
    assert len(memory) == 2 and memory.tokens == 20
    assert memory.match([100, 101, 102, 103]) is None and memory.match([300, 301, 302, 303]) is not None
    memory.clear()
    assert len(memory) == 0 and memory.match([300, 301, 302, 303]) is None


def test_the_proposer_follows_a_text_while_the_answer_takes_it_then_falls_back():
    memory = AnswerMemory()
    memory.add([1, 2, 3, 4] + list(range(10, 30)))
    proposer = MemoryProposer(memory, fallback=NgramProposer())
    draft = proposer.propose([8, 1, 2, 3, 4], budget(3, 5))
    assert draft.tokens == [10, 11, 12, 13, 14] and draft.evidence_class == "memory/match-4"
    draft = proposer.propose([8, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15], budget(3, 5))  # took the span and its own next token
    assert draft.tokens == [16, 17, 18, 19, 20] and draft.evidence == "following"
    draft = proposer.propose([8, 1, 2, 3, 4, 10, 11, 12, 13, 14, 15, 16, 99], budget(3, 5))  # departed: nothing matches
    assert draft.source != "memory"
    proposer.propose([7, 1, 2, 3, 4], budget(3, 5))  # found again by a 4-token match
    draft = proposer.propose([7, 1, 2, 3, 4, 10], budget(3, 5))  # that span cut to nothing: one plain token agrees
    assert draft.tokens == [11, 12, 13, 14, 15] and draft.evidence == "rejoined"


def _tokens(events) -> list[int]:
    return [e.token_id for e in events if e.type == "token"]


def test_a_remembered_answer_drafts_the_same_request_again_and_stays_exact():
    target, _ = tiny_pair(6)
    prompt = [11, 12, 13, 14, 15, 16, 17]
    sampling = SamplingConfig(max_new_tokens=64, stop_on_eos=False)
    stream = lambda: TokenStream(target.tokenizer, target.eos_ids, 64, False)  # noqa: E731
    reference = _tokens(run(reference_generate(cached(target), prompt, stream(), sampling)))
    memory = AnswerMemory()
    memory.add(prompt + reference)
    events = run(speculative_generate(cached(target), MemoryProposer(memory, NgramProposer()), prompt, stream(),
                                      sampling, k_policy=OnThisCurve(64)))
    assert _tokens(events) == reference
    remembered = events[-1].stats.of_source("memory")
    assert remembered.accepted >= 0.9 * len(reference)
    assert [e.kind for e in events if e.type == "token"][:2] == ["plain", "accepted"]  # after the prefill's token


def test_the_engine_remembers_each_scope_apart_and_forgets_on_request():
    from engine.chat_engine import ChatEngine
    engine = ChatEngine(measure_beside=False)
    engine.use_models(*tiny_pair(7))
    messages = [{"role": "user", "content": "hello there"}]
    sampling = SamplingConfig(max_new_tokens=12)
    done = final_done(engine.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF, memory_scope="user:a"))
    mine, other = engine.memories.get(engine.target.name, "user:a"), engine.memories.get(engine.target.name, "")
    assert len(mine) == 1 and len(other) == 0
    assert memory_holds(mine, engine.encode(messages) + list(done.token_ids))
    engine.memory_clear()
    assert len(mine) == 0


def memory_holds(memory: AnswerMemory, tokens: list[int]) -> bool:
    found = memory.match(tokens[:-1])
    return found is not None and memory.text(found[0], found[1], 1) == tokens[-1:]


def test_a_seeded_sampled_answer_is_the_same_again_though_the_memory_holds_the_first():
    """The memory drafts greedy requests only: rejection sampling draws from the seeded generator as its drafts go,
    so a remembered first answer would make the second draw another sample."""
    from engine.chat_engine import ChatEngine
    engine = ChatEngine(measure_beside=False)
    engine.use_models(*tiny_pair(8))
    messages = [{"role": "user", "content": "tell me something"}]
    sampling = SamplingConfig(max_new_tokens=24, temperature=0.9, seed=3, stop_on_eos=False)
    spec = SpecConfig(k=3, proposer="draft")  # a fixed k: the drafts, so the draws, do not depend on timings
    first = final_done(engine.generate(messages, sampling, spec, cache=CACHE_OFF))
    again = final_done(engine.generate(messages, sampling, spec, cache=CACHE_OFF))
    assert len(engine.memories.get(engine.target.name)) == 1  # the sampled answer joined the memory (once)
    assert again.token_ids == first.token_ids and again.stats.of_source("memory").proposed == 0
