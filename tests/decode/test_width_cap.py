"""The load-time identity check's width cap (IdentityCheck.width_cap) bounds every verify of an adaptive k: no step
drafts more than width_cap - 1 tokens, whatever the proposer offers."""
from __future__ import annotations

from engine.config import SamplingConfig, SpecConfig
from engine.start.decoders import start_speculative
from tests.helpers.tiny import tiny_pair

PROMPT = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 6  # a repeating text: the lookup finds long spans to offer


def _steps(width_cap):
    target, draft = tiny_pair(0)
    sampling = SamplingConfig(max_new_tokens=40, stop_on_eos=False)
    spec = SpecConfig(k=8, proposer="lookup", adaptive=True)
    events = list(start_speculative(target, draft, PROMPT, sampling, spec, width_cap=width_cap))
    return [e.k for e in events if e.type == "stats"], events[-1]


def test_an_adaptive_k_keeps_to_the_identical_width_and_answers_the_same():
    capped, capped_done = _steps(3)
    free, free_done = _steps(None)
    assert capped and max(capped) <= 2
    assert max(free) > 2  # the same request drafts wider where nothing caps it
    assert capped_done.token_ids == free_done.token_ids  # fp32 tiny models: greedy is the target's either way
