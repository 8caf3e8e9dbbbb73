"""The load-time identity check's width cap (IdentityCheck.width_cap) bounds every verify of an adaptive k: no step
drafts more than width_cap - 1 tokens, whatever the proposer offers."""
from __future__ import annotations

import pytest

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


def _target_forwards(monkeypatch, spec: SpecConfig | None, width_cap: int | None = None) -> list[tuple[int, int]]:
    """(tokens fed, rows of logits) of each target forward of one greedy answer to PROMPT; ``spec`` None: the
    target-only reference."""
    import engine.start.decoders as decoders

    target, draft = tiny_pair(0)
    fed: list[tuple[int, int]] = []
    real = decoders.runner_for

    def recording(loaded, context_ids=None):
        runner = real(loaded, context_ids)
        if loaded is target:
            forward = runner.forward
            runner.forward = lambda ids, n_logits=0: fed.append((len(ids), n_logits)) or forward(ids, n_logits)
        return runner

    monkeypatch.setattr(decoders, "runner_for", recording)
    sampling = SamplingConfig(max_new_tokens=40, stop_on_eos=False)
    if spec is None:
        list(decoders.start_reference(target, PROMPT, sampling))
    else:
        list(start_speculative(target, draft, PROMPT, sampling, spec, width_cap=width_cap))
    return fed


def test_no_forward_that_carries_a_draft_is_wider_than_the_cap(monkeypatch):
    """The prompt's prefill runs without a draft, as the target-only decoder's does: a draft verified inside a long
    prefill would take the wide kernel the check found unequal (llama.cpp's tiled matmul from 8 rows)."""
    fed = _target_forwards(monkeypatch, SpecConfig(k=8, proposer="lookup", adaptive=True), width_cap=3)
    assert fed[0] == (len(PROMPT), 1)  # the prefill alone
    drafted = [n for n, rows in fed if rows > 1]
    assert drafted and max(drafted) <= 3
    fed = _target_forwards(monkeypatch, SpecConfig(k=8, proposer="lookup", adaptive=True))
    assert fed[0] == (len(PROMPT), 1)  # uncapped too: the prefill alone, as the reference feeds it
    assert max(n for n, rows in fed if rows > 1) > 3  # and wider verifies after it


@pytest.mark.parametrize("spec", [SpecConfig(k=4), SpecConfig(k=4, proposer="lookup"),
                                  SpecConfig(proposer="hybrid", adaptive=True), SpecConfig(k=8, adaptive=True)],
                         ids=["draft", "lookup", "hybrid", "adaptive"])
def test_every_proposer_feeds_the_prompt_as_the_reference_does(monkeypatch, spec):
    """Greedy speculation is the target's own only if every row the target computes is computed as the reference
    computes it. The prompt's rows come from the reference's very forward (a draft folded into it made it wider,
    and on an AMX CPU torch's int4 target then rounded every prompt row otherwise: docs/engine.md); every later
    forward feeds the newest token and the draft, the verifies the load-time identity check measures."""
    reference = _target_forwards(monkeypatch, None)
    fed = _target_forwards(monkeypatch, spec)
    assert fed[0] == reference[0] == (len(PROMPT), 1)
    assert all(n == rows for n, rows in fed[1:])  # one unseen token, then the draft: one row of logits each
    assert any(rows > 1 for _, rows in fed)  # it did draft
