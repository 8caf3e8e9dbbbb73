"""No proposer at a loss: free (lookup) drafts are priced on the measured verify curve, cut to the length that pays,
skipped where none does, and the stats say so; the loop's answer stays the target's."""
from __future__ import annotations

from engine.config import SamplingConfig
from engine.decode.reference import reference_generate
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.proposers import NgramProposer
from engine.costs.costmodel import StepCosts
from engine.decode.kpolicy import FixedK
from engine.decode.step import StepRecord
from tests.helpers.tiny import cached, run, tiny_pair

# a compute-bound verify curve, as measured on a CPU (docs/engine.md, "No proposer runs at a loss")
COMPUTE_BOUND = StepCosts(verify_fixed_s=0.083, verify_per_token_s=0.0465, draft_per_token_s=0.0)


class OnThisCurve(FixedK):
    """The lookup mode's policy (k bounds the lookups) with its costs held at a compute-bound curve: this test's
    timings are a tiny model's, and the decision must be the one such a machine would make."""

    def __init__(self, k: int):
        super().__init__(k, span=k)

    @property
    def costs(self):
        return COMPUTE_BOUND


def _tokens(events) -> list[int]:
    return [e.token_id for e in events if e.type == "token"]


def test_lookup_spans_are_cut_to_what_pays_and_said_why_and_the_answer_is_the_targets():
    target, _ = tiny_pair(3)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 4  # repeats: the lookup always finds a long span
    sampling = SamplingConfig(max_new_tokens=60, stop_on_eos=False)
    stream = lambda: TokenStream(target.tokenizer, target.eos_ids, 60, False)  # noqa: E731
    reference = _tokens(run(reference_generate(cached(target), prompt, stream(), sampling)))
    events = run(speculative_generate(cached(target), NgramProposer(), prompt, stream(), sampling,
                                      k_policy=OnThisCurve(16)))
    assert _tokens(events) == reference
    stats = events[-1].stats
    cut = stats.latest_cut
    assert stats.cut_steps > 0 and cut.proposer == "lookup" and cut.kept < cut.drafted
    assert cut.verify_per_token_s == COMPUTE_BOUND.verify_per_token_s
    assert stats.k <= 16


def test_lookups_that_keep_failing_end_in_target_only_steps():
    """A random tiny model does not continue its prompt's repeats: its lookups fail, the pricing skips them (the
    probes back off), and most steps are plain target steps."""
    target, _ = tiny_pair(4)
    prompt = [20, 21, 22, 23] * 6
    sampling = SamplingConfig(max_new_tokens=80, stop_on_eos=False)
    policy = OnThisCurve(16)
    for _ in range(10):  # what the policy had already measured: lookups here are wrong
        policy.free.update(StepRecord(n_drafted=4, n_accepted=0, n_fed=5, draft_s=0.0, verify_s=0.27, free=True,
                                      source="lookup", evidence="lookup/match-4"))
    events = run(speculative_generate(cached(target), NgramProposer(), prompt,
                                      TokenStream(target.tokenizer, target.eos_ids, 80, False), sampling,
                                      k_policy=policy))
    stats = events[-1].stats
    verified = stats.acceptance.proposed
    assert verified <= 4, verified  # at most the backed-off one-token probes
    assert stats.latest_cut.kept == 0  # skipped: a target-only step
