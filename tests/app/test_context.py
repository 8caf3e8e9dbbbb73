"""app/context.py: what the handlers share: one cancel flag per session, and the pair (or None) from the engine."""
import json
import threading

import pytest

from app.context import AppContext
from app.turn import Turn, trace_document
from engine.costs.costmodel import StepCosts
from engine.errors import NoPairError
from engine.surface import PairInfo
from tests.helpers.fakes import FakeEngine


def test_cancel_flags_are_per_session():
    ctx = AppContext(FakeEngine([]))
    with ctx.cancels.running("a") as a, ctx.cancels.running("b") as b:
        assert ctx.cancels.cancel("a") and a.is_set() and not b.is_set()
        assert isinstance(a, threading.Event) and not ctx.cancels.cancel("nobody")
    assert b.is_set()  # leaving the block stops its generation
    assert not ctx.cancels.cancel("b")  # a finished generation has no flag left


def test_context_hides_only_the_no_pair_error():
    class Broken:
        def info(self):
            raise KeyError("bug")

    class Empty:
        def info(self):
            raise NoPairError("none")

    assert AppContext(Empty()).pair() is None and AppContext(Empty()).speed(None) is None
    with pytest.raises(KeyError):
        AppContext(Broken()).pair()


def test_the_pair_is_the_engines_own_value_costs_included():
    costs = StepCosts(verify_fixed_s=0.05, verify_per_token_s=0.01, draft_per_token_s=0.02)

    class Loaded:
        def info(self):
            return PairInfo("t", "d", "bf16", "nf4", "cpu", costs=costs, runner="torch", bit_identical=True)

    pair = AppContext(Loaded()).pair()
    assert pair == Loaded().info() and pair.costs == costs
    written = json.loads(json.dumps(trace_document(Turn(), [], pair, {})))["pair"]  # what the export writes
    assert written["costs"]["verify_per_token_s"] == 0.01 and written["bit_identical"] and written["runner"] == "torch"
