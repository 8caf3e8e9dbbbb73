"""app/baseline.py: the target-only speed the engine measured, as the views read it, and the quiet ones remembered
in a file per target, precision and device (the experiment grid's estimates)."""
import json

import pytest

from app.baseline import BaselineStore, baseline_key
from app.context import AppContext
from tests.helpers.fakes import SCRIPT, FakeEngine


def test_the_speed_is_the_engines_and_a_quiet_one_is_remembered(tmp_path):
    engine = FakeEngine([])
    ctx = AppContext(engine, BaselineStore(tmp_path / "b.json"))
    record = ctx.speed(ctx.pair())
    assert record["tokens_per_s"] == pytest.approx(8.0) and record["decode_tokens_per_s"] == pytest.approx(10.0)
    assert not record["flagged"] and SCRIPT in record["how"]  # the views escape it
    assert json.loads((tmp_path / "b.json").read_text())[baseline_key(engine.info())] == record


def test_no_speed_while_measuring_and_a_busy_one_is_not_remembered(tmp_path):
    engine = FakeEngine([])
    engine.measuring = True
    ctx = AppContext(engine, BaselineStore(tmp_path / "b.json"))
    assert ctx.speed(ctx.pair()) is None
    engine.measuring = False
    engine.info = lambda: FakeEngine.info(engine).__class__(**{**FakeEngine.info(engine).__dict__,
                                                             "checks_note": "measured on a busy machine (x)",
                                                             "checks_flagged": True})
    assert ctx.speed(ctx.pair())["flagged"] and not (tmp_path / "b.json").exists()  # not kept as the truth
    assert ctx.baselines.get(baseline_key(engine.info()))["flagged"]  # but the grid estimate may use it, flagged


def test_baselines_stay_in_memory_when_the_file_cannot_be_written(tmp_path):
    (tmp_path / "not-a-dir").write_text("x")
    store = BaselineStore(tmp_path / "not-a-dir" / "baselines.json")
    store.put("k", {"tokens_per_s": 5.0})
    assert store.get("k") == {"tokens_per_s": 5.0}
    assert "not-a-dir" in store.write_error and "memory" in store.write_error
