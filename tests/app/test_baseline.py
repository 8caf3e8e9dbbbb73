"""app/baseline.py: the target-only speed, measured once per target, precision and device, kept in a file."""
import json

import pytest

from app.baseline import BaselineStore, baseline_key, get_or_measure
from tests.helpers.fakes import FakeEngine


def test_baseline_is_measured_once_and_cached(tmp_path):
    engine, store = FakeEngine([]), BaselineStore(tmp_path / "b.json")
    first = get_or_measure(engine, store)
    assert first["tokens_per_s"] == pytest.approx(8.0)
    engine.generate_reference = None  # a second call must not measure again
    assert get_or_measure(engine, BaselineStore(tmp_path / "b.json")) == first
    assert baseline_key(engine.info()) in json.loads((tmp_path / "b.json").read_text())


def test_baselines_stay_in_memory_when_the_file_cannot_be_written(tmp_path):
    (tmp_path / "not-a-dir").write_text("x")
    store = BaselineStore(tmp_path / "not-a-dir" / "baselines.json")
    store.put("k", {"tokens_per_s": 5.0})
    assert store.get("k") == {"tokens_per_s": 5.0}
    assert "not-a-dir" in store.write_error and "memory" in store.write_error
