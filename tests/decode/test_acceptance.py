"""engine.events.Acceptance, the one value that counts how drafts fared (for the stats, the lab and the doctor), and
the StatsEvent that carries it with the fitted costs and the latest cut free draft."""
import json

import pytest

from engine.costs.costmodel import StepCosts
from engine.decode.step import StepRecord
from engine.decode.stream import StatsTracker
from engine.events import Acceptance, DraftCut


def step(n_drafted: int, n_accepted: int, free: bool = False) -> StepRecord:
    return StepRecord(n_drafted=n_drafted, n_accepted=n_accepted, n_fed=n_drafted + 1, draft_s=0.01, verify_s=0.1,
                      free=free)


def test_steps_add_up_by_position():
    counts = Acceptance().add(step(4, 2)).add(step(0, 0)).add(step(2, 2)).add(step(5, 5, free=True))
    assert (counts.steps, counts.proposed, counts.accepted, counts.rejected_steps) == (4, 11, 9, 1)
    assert counts.proposed_by_pos == (3, 3, 2, 2, 1) and counts.accepted_by_pos == (3, 3, 1, 1, 1)
    assert counts.acceptance_rate == pytest.approx(9 / 11)
    assert counts.alpha == pytest.approx(9 / 10)  # one rejection: the step that kept 2 of 4
    assert counts.mean_accepted == pytest.approx(9 / 4) and counts.mean_drafted == pytest.approx(11 / 4)
    assert counts.rate_by_pos == pytest.approx((1.0, 1.0, 0.5, 0.5, 1.0))


def test_runs_sum_as_if_their_steps_had_been_one_run():
    first, second = Acceptance().add(step(3, 1)), Acceptance().add(step(1, 1)).add(step(5, 0))
    together = Acceptance().add(step(3, 1)).add(step(1, 1)).add(step(5, 0))
    assert first + second == together == sum((first, second), Acceptance())
    assert Acceptance() + Acceptance() == Acceptance()
    assert Acceptance().alpha == Acceptance().acceptance_rate == Acceptance().mean_accepted == 0.0
    assert Acceptance(proposed_by_pos=(0, 2), accepted_by_pos=(0, 1)).rate_by_pos == (None, 0.5)


def test_the_stats_hold_the_trackers_values_and_say_them_in_json():
    tracker = StatsTracker(proposer="lookup")
    costs = StepCosts(verify_fixed_s=0.05, verify_per_token_s=0.01, draft_per_token_s=0.0, verify_table=((1, 0.06),))
    tracker.record_step(step(4, 3), costs=costs)
    tracker.record_step(step(4, 4), costs=costs, cut=DraftCut("lookup", 9, 4, costs.verify_per_token_s))
    snapshot = tracker.snapshot(new_tokens=9)
    assert snapshot.acceptance == Acceptance().add(step(4, 3)).add(step(4, 4))
    assert snapshot.costs == costs and snapshot.cut_steps == 1 and snapshot.latest_cut.kept == 4
    as_json = json.loads(json.dumps(snapshot.to_dict()))
    assert as_json["acceptance"]["accepted"] == 7 and as_json["acceptance"]["alpha"] == pytest.approx(7 / 8)
    assert as_json["acceptance"]["mean_accepted"] == pytest.approx(3.5)
    assert as_json["acceptance"]["accepted_by_pos"] == [2, 2, 2, 1]
    assert as_json["costs"] == {"verify_fixed_s": 0.05, "verify_per_token_s": 0.01, "draft_per_token_s": 0.0,
                                "verify_table": [[1, 0.06]], "catch_up_per_token_s": None}
    assert as_json["latest_cut"] == {"proposer": "lookup", "drafted": 9, "kept": 4, "verify_per_token_s": 0.01}
    assert json.loads(json.dumps(StatsTracker().snapshot(0).to_dict()))["costs"] is None  # target-only: no fit
