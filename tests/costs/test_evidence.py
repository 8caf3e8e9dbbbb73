"""Known text priced by its evidence (engine/decode/free_drafts.py FreeDrafts): a prediction the answer follows is
verified in wide spans from its first followed span, a wrong one is dropped within a few narrow steps, and each
source and evidence class learns apart. Fixed costs: the decisions a machine with this curve would make, no clock."""
from __future__ import annotations

import pytest

from engine.config import SamplingConfig
from engine.decode.draft import EMPTY_DRAFT, Draft
from engine.decode.free_drafts import FreeDrafts
from engine.decode.step import StepRecord
from engine.decode.reference import reference_generate
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.proposers import NgramProposer
from engine.proposers.prediction import PredictionProposer
from tests.helpers.curves import CURVE, OnThisCurve, on_curve
from tests.helpers.tiny import cached, run, tiny_pair


def free_step(evidence: str, drafted: int, accepted: int) -> StepRecord:
    return StepRecord(n_drafted=drafted, n_accepted=accepted, n_fed=drafted + 1, draft_s=0.0, verify_s=0.1, free=True,
                      source=evidence.split("/")[0], evidence=evidence)


def test_a_followed_prediction_is_verified_wide_and_grows_wider_while_it_is_followed():
    free = FreeDrafts()
    first = free.limit(CURVE, "prediction/following")
    assert first + 1 >= 16  # a span the answer took whole: verified 16 wide at once (t(16): 6.5 one-token forwards)
    for _ in range(3):
        free.update(free_step("prediction/following", 64, 64))
    assert free.limit(CURVE, "prediction/following") == 64
    assert 0 < free.limit(CURVE, "lookup/match-2") < first  # other classes keep their own, weaker price


def test_the_8_row_bump_is_priced_as_measured():
    """t(8) costs more than t(16) here: a verify 8 to 15 wide is never the best; the curve is not flattened."""
    assert CURVE.verify_s(8) > CURVE.verify_s(16)
    free = FreeDrafts()
    for accepted in (0, 2, 5, 16, 40, 64):
        free.update(free_step("lookup/match-4", 64, accepted))
        width = free.limit(CURVE, "lookup/match-4") + 1
        assert not 8 <= width <= 15, (accepted, width)


def test_a_wrong_source_is_dropped_within_a_few_spans_and_its_other_classes_start_from_what_it_showed():
    free = FreeDrafts()
    spans = 0
    while free.limit(CURVE, "prediction/match-3") and spans < 10:
        free.update(free_step("prediction/match-3", free.limit(CURVE, "prediction/match-3"), 0))
        spans += 1
    assert spans <= 2
    assert free.limit(CURVE, "prediction/match-5") == 0  # the same source's other evidence starts from its record
    assert free.limit(CURVE, "prediction/following") > 0  # but an answer that follows it is still believed


CHEAP_WIDE = on_curve(((1, 1.0), (2, 2.07), (4, 2.73), (8, 3.9), (16, 4.16), (32, 6.1), (64, 10.1)), one=0.0314)


@pytest.mark.parametrize("curve", [CURVE, CHEAP_WIDE], ids=["zen3", "zen5"])
def test_spans_the_answer_leaves_after_a_few_tokens_are_narrowed_within_two_spans_after_a_long_one(curve):
    """Known text is copied or it is not. After a 21-token span taken whole, spans the answer leaves after 1-3 tokens
    (an edit that rewrites most lines: edit20-async) are cut within two spans to the narrow widths their runs pay for,
    where a per-token acceptance (24 of 25 tokens taken: 0.96) kept verifying 15 wide on the cheap-wide curve; a span
    the answer then follows is still verified wide; and once its probes are taken whole again, the class widens."""
    free = FreeDrafts()
    free.update(free_step("prediction/rejoined", 21, 21))
    widths = []
    for run in (3, 3, 2, 1, 2):
        widths.append(free.limit(curve, "prediction/rejoined"))
        free.update(free_step("prediction/rejoined", widths[-1], min(run, max(widths[-1] - 1, 0))))
    assert widths[0] >= 15 and max(widths[2:]) <= 4, widths
    assert free.limit(curve, "prediction/following") >= 15
    for _ in range(20):  # a probe after 8 losing steps (Backoff), then spans taken whole
        width = free.limit(curve, "prediction/rejoined")
        if width:
            free.update(free_step("prediction/rejoined", width, width))
    assert width >= 15


def test_an_unproven_match_is_not_a_wide_gamble_where_wide_verifies_are_cheap():
    """A curve with t(16) at 4.2 one-token forwards (2 Zen 5 cores, the identity settings): a 3-token match of a source
    with no record yet is not drafted (a failed 15-token verify costs 3 forwards, 5% of a 96-token answer), a span
    the answer follows is verified wide at once, and once the source has paid its matches are drafted too."""
    cheap_wide = CHEAP_WIDE
    free = FreeDrafts()
    assert free.limit(cheap_wide, "lookup/match-3") == 0
    assert free.limit(cheap_wide, "prediction/following") >= 15
    for _ in range(2):
        free.update(free_step("lookup/following", 32, 32))
    assert free.limit(cheap_wide, "lookup/match-3") >= 15


def _tokens(events) -> list[int]:
    return [e.token_id for e in events if e.type == "token"]


def test_the_loop_drafts_a_right_prediction_from_its_first_token_and_drops_a_wrong_one():
    """On a tiny model: with its own answer as the prediction, the first step after the prefill drafts it and most
    tokens are accepted in wide spans; with a wrong prediction, few tokens are verified before it is dropped. Both
    answers are the target's."""
    target, _ = tiny_pair(5)
    prompt = [7, 8, 9, 10, 11, 12]
    sampling = SamplingConfig(max_new_tokens=96, stop_on_eos=False)
    stream = lambda: TokenStream(target.tokenizer, target.eos_ids, 96, False)  # noqa: E731
    reference = _tokens(run(reference_generate(cached(target), prompt, stream(), sampling)))

    def decode(prediction):
        proposer = PredictionProposer(prediction, fallback=NgramProposer())
        return run(speculative_generate(cached(target), proposer, prompt, stream(), sampling,
                                        k_policy=OnThisCurve(64)))

    right = decode(reference)
    assert _tokens(right) == reference
    tokens = [e for e in right if e.type == "token"]
    assert [e.kind for e in tokens[:2]] == ["plain", "accepted"]  # the prefill's own token, then the prediction
    assert sum(e.kind == "accepted" for e in tokens) >= 0.8 * len(reference)
    assert max(e.draft_pos for e in tokens if e.kind == "accepted") >= 31  # spans of 32 and more
    vocab = target.vocab_size
    wrong = decode([(t + 1) % vocab for t in reference])  # never the answer's next token
    assert _tokens(wrong) == reference
    assert wrong[-1].stats.acceptance.proposed <= 12, wrong[-1].stats.acceptance.proposed


def test_a_long_lookup_match_is_drafted_wide_and_dropped_when_the_answer_keeps_leaving_it():
    """A lookup found FOLLOWING_MATCH tokens long is priced as following (tests/proposers: the evidence): drafted 16
    wide though the lookup's short matches lose, and dropped within a few spans where the answer leaves each at once
    (the prior's weight stays below what the decayed rejections reach, so no curve keeps it for ever)."""
    free = FreeDrafts()
    for _ in range(3):
        free.update(free_step("lookup/match-3", 15, 0))
    assert free.limit(CURVE, "lookup/match-3") == 0
    assert free.limit(CURVE, "lookup/following") + 1 >= 16
    spans = 0
    while free.limit(CURVE, "lookup/following") and spans < 10:
        free.update(free_step("lookup/following", free.limit(CURVE, "lookup/following"), 0))
        spans += 1
    assert spans <= 4


def test_a_priced_out_class_whose_first_tokens_the_answer_takes_is_probed_narrowly_and_a_wrong_one_is_not():
    """A free draft cut to nothing still says something: the target's plain token was its first or not. A class
    priced out by its failures whose first tokens the answer then takes is probed 1 token wide at once (not after the
    Backoff's 8 steps); one whose first tokens the answer does not take stays at 0."""
    free = FreeDrafts()
    for evidence in ("memory/following", "lookup/match-3"):
        for _ in range(2):
            free.update(free_step(evidence, 15, 0))
        assert free.limit(CURVE, evidence) == 0
    for agreed, evidence in ((True, "memory/following"), (False, "lookup/match-3")):
        for _ in range(3):
            free.update(StepRecord(n_drafted=0, n_accepted=0, n_fed=1, draft_s=0.0, verify_s=0.1, evidence=evidence,
                                   unverified_agreed=agreed))
    assert free.limit(CURVE, "memory/following") == 1
    assert free.limit(CURVE, "lookup/match-3") == 0


class PricedOut(OnThisCurve):
    """Every free draft priced out; the steps the loop reports kept."""

    def __init__(self):
        super().__init__(64)
        self.steps: list[StepRecord] = []

    def _price(self, evidence: str, most: int) -> int:
        return 0

    def update(self, step: StepRecord) -> None:
        self.steps.append(step)
        super().update(step)


class NoFallback:
    """Nothing to draft once the prediction has no span: only the prediction's spans are offered."""
    name = "none"

    def reset(self, prompt_ids, sampling, generator) -> None:
        pass

    def behind(self, context_ids) -> int:
        return 0

    def propose(self, context_ids, budget) -> Draft:
        return EMPTY_DRAFT


def test_the_loop_tells_a_priced_out_draft_whether_its_first_token_was_the_targets():
    """The steps the loop reports for a prediction priced out at every step: the answer itself as the prediction, each
    says its first token was the target's; a prediction that leaves the answer after its first token, it was not."""
    target, _ = tiny_pair(5)
    prompt = [7, 8, 9, 10, 11, 12]
    sampling = SamplingConfig(max_new_tokens=24, stop_on_eos=False)
    reference = _tokens(run(reference_generate(cached(target), prompt, TokenStream(target.tokenizer, target.eos_ids,
                                                                                   24, False), sampling)))
    wrong = [reference[0], *((t + 1) % target.vocab_size for t in reference[1:])]  # its start, then never the answer
    for prediction, agreed in ((reference, True), (wrong, False)):
        policy = PricedOut()
        events = run(speculative_generate(cached(target), PredictionProposer(prediction, NoFallback()), prompt,
                                          TokenStream(target.tokenizer, target.eos_ids, 24, False), sampling, policy))
        assert _tokens(events) == reference
        offered = [s for s in policy.steps if s.unverified_agreed is not None]
        assert len(offered) >= (12 if agreed else 1) and not any(s.n_drafted for s in policy.steps)
        assert all(s.unverified_agreed is agreed and s.evidence.startswith("prediction/") for s in offered)
