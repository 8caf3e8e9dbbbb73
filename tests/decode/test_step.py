"""The step budget (engine/decode/step.py): every cap on a step in one value, said once per step by the k policy."""
from __future__ import annotations

import torch

from engine.config import FREE_SPAN, SamplingConfig, SpecConfig
from engine.decode.kpolicy import AdaptiveK, FixedK, Waiting, policy_for
from engine.decode.draft import Draft
from engine.decode.step import StepBudget, StepRecord
from engine.proposers import DraftModelProposer, NgramProposer
from engine.proposers.prediction import PredictionProposer
from tests.helpers.curves import CURVE
from tests.helpers.tiny import budget, cached, tiny_pair


def test_the_room_caps_k_and_span_and_says_why():
    free = StepBudget.within(4, FREE_SPAN, "adaptive k 4", remaining=10, unseen=1, width=None)
    assert (free.k, free.span) == (4, 9) and free.why == "adaptive k 4; 9 tokens of room"  # one is the target's
    last = StepBudget.within(4, FREE_SPAN, "adaptive k 4", remaining=1, unseen=1, width=None)
    assert (last.k, last.span) == (0, 0)  # the last token is the target's own: nothing to draft
    open_ended = StepBudget.within(4, FREE_SPAN, "fixed k 4", remaining=None, unseen=1, width=None)
    assert (open_ended.k, open_ended.span, open_ended.why) == (4, FREE_SPAN, "fixed k 4")


def test_a_step_drafts_only_beside_its_newest_token():
    """Identical mode: no forward that carries a draft feeds more than the width. Any mode: while the target has
    more than the newest token to take (a prompt, what a reused runner did not hold), the step drafts nothing and
    those tokens are fed alone, as the target-only decoder feeds them, however short."""
    step = StepBudget.within(6, FREE_SPAN, "adaptive k 6", remaining=100, unseen=1, width=7)
    assert (step.k, step.span) == (6, 6)
    for width in (7, None):
        for unseen in (2, 40):
            prefill = StepBudget.within(6, FREE_SPAN, "adaptive k 6", remaining=100, unseen=unseen, width=width)
            assert (prefill.k, prefill.span) == (0, 0)
            assert prefill.why == f"adaptive k 6; the prompt's {unseen} tokens are fed alone first"


def test_keep_prices_a_free_draft_by_its_evidence_within_the_span_and_leaves_a_models_alone():
    asked = []

    def price(evidence, most):
        asked.append((evidence, most))
        return 3

    step = StepBudget(2, 5, "test", price=price)
    kept, cut = step.keep(Draft(list(range(10)), source="prediction", evidence="following"))
    assert kept.tokens == [0, 1, 2] and asked == [("prediction/following", 5)]  # priced among what it could keep
    assert (cut.proposer, cut.drafted, cut.kept) == ("prediction", 10, 3)
    model = Draft([7, 8], torch.full((2, 4), 0.25), "draft")
    assert step.keep(model) == (model, None) and len(asked) == 1  # a model's draft is sized by k, not priced
    unpriced = StepBudget(0, 5, "no costs yet")
    assert unpriced.keep(Draft(list(range(10)), source="lookup", evidence="match-3"))[0].tokens == [0, 1, 2, 3, 4]


def test_each_policy_says_its_budget_and_why():
    assert Waiting().budget(remaining=50) == StepBudget(0, 0, "waiting for this machine's step costs", fallback=True,
                                                        waiting=True)
    fixed = FixedK(3).budget(remaining=500)
    assert (fixed.k, fixed.span, fixed.why) == (3, FREE_SPAN, "fixed k 3")
    lookup = policy_for(SpecConfig(k=5, proposer="lookup")).budget(remaining=50)
    assert (lookup.k, lookup.span) == (5, 5)  # a user's fixed k sizes a lookup's drafts
    adaptive_lookup = policy_for(SpecConfig(k=5, proposer="lookup", adaptive=True)).budget(remaining=500)
    assert (adaptive_lookup.k, adaptive_lookup.span) == (0, FREE_SPAN)  # no draft model: free spans, priced
    losing = AdaptiveK(k_init=4, prior=CURVE, probe_every=64)
    losing.accepted, losing.rejected = 0.0, 50.0
    target_only = losing.budget(remaining=500)
    assert target_only.k == 0 and target_only.fallback and target_only.why.startswith("target-only")
    assert target_only.span == FREE_SPAN  # known text is priced on its own evidence, not the draft model's


def test_a_draft_model_says_how_far_behind_it_is_and_what_it_fed():
    """What the catch-up is priced on: the prompt a draft runner has not seen (a pooled runner that holds part of it
    resumes there), then after each step the target's tokens it missed: one after a fully accepted draft (the
    bonus; the last drafted token was never fed), none after a rejection."""
    target, draft = tiny_pair(0)
    runner = cached(draft)
    runner.forward([5, 6, 7, 8], n_logits=1)  # a pooled runner holding part of the next prompt
    proposer = DraftModelProposer(runner)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12]
    proposer.reset(prompt, SamplingConfig(), torch.Generator())
    assert proposer.behind(prompt) == 3  # 9, 10, 11 (12 is fed with every step)
    first = proposer.propose(prompt, budget(3))
    assert len(first) == 3 and first.fed == 4 + 2  # the catch-up and the step's newest token, then two drafted ones
    record = StepRecord(n_drafted=3, n_accepted=3, n_fed=4, draft_s=0.0, verify_s=0.0, draft_fed=first.fed)
    assert record.caught_up == 3
    accepted_all = prompt + first.tokens + [1]
    assert proposer.behind(accepted_all) == 1
    second = proposer.propose(accepted_all, budget(2))
    rejected = accepted_all + second.tokens[:0] + [(second.tokens[0] + 1) % draft.vocab_size]
    assert proposer.behind(rejected) == 0
    assert proposer.behind(rejected + [1, 2, 3]) == 3  # target-only steps since: what it missed
    assert NgramProposer().behind(prompt) == 0
    assert PredictionProposer([1, 2], fallback=proposer).behind(rejected + [1, 2, 3]) == 3  # a composite asks its model
