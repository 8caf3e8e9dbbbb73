"""Serve first, measure beside (engine/serve/measuring.py): a pair answers before its load-time figures are in, with
target-only steps and the pair saying so; the figures' pieces wait for the models to be idle; a busy measurement is
flagged, used for now and never kept; quiet figures are kept and read back by the next engine."""
import itertools
import json
import threading

import pytest

from engine.chat_engine import ChatEngine
from engine.config import SamplingConfig, SpecConfig
from engine.events import final_done
from engine.models.load_checks import LoadChecks, TargetSpeed, measure_step_costs
from engine.serve import kept_figures, measuring
from engine.serve.kept_figures import MeasuredStore
from engine.serve.measuring import CpuWatch, busy_reason, idle_step, measure_pair
from engine.serve.model_lock import MEASURING, ModelLock
from tests.helpers.tiny import tiny_pair

GREEDY = SamplingConfig(temperature=0.0, max_new_tokens=12, stop_on_eos=False)
HI = [{"role": "user", "content": "hello there"}]


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fake_cpu(samples):
    """A ``CpuWatch`` read: each call the next (all processes' CPU seconds, this process's CPU seconds)."""
    it = iter(samples)
    return lambda: next(it)


def test_the_cpu_watch_counts_what_other_processes_took():
    clock = FakeClock()
    # 10 s of wall time on 2 CPUs: 20 CPU-seconds in all; this process 9, everything 19 -> others 10 = 50%
    watch = CpuWatch(read=fake_cpu([(100.0, 50.0), (119.0, 59.0)]), clock=clock, cpus=2).start()
    clock.now += 10
    assert watch.others_share() == pytest.approx(0.5)
    quiet = CpuWatch(read=fake_cpu([(100.0, 50.0), (118.5, 68.0)]), clock=clock, cpus=2).start()
    clock.now += 10
    assert quiet.others_share() == pytest.approx(0.025)
    assert CpuWatch(read=lambda: None, clock=clock).start().others_share() is None  # no /proc/stat: not known
    assert "50%" in busy_reason(0.1, 0.5) and busy_reason(0.1, 0.025) == "" and busy_reason(0.1, None) == ""
    assert "differed by 80%" in busy_reason(0.8, 0.0)  # rounds that never came close: busy, whatever the watch says


def test_one_bar_says_busy_for_the_load_and_the_repack_probe():
    from engine.models.cpu_watch import BUSY_SHARE, others_busy, others_reason
    assert not others_busy(BUSY_SHARE) and others_busy(BUSY_SHARE + 0.01) and not others_busy(None)
    assert others_reason(BUSY_SHARE, "x ran") == "" and others_reason(None, "x ran") == ""
    assert others_reason(0.6, "x ran") == "other processes took 60% of the CPUs while x ran"
    assert busy_reason(0.0, 0.6) == others_reason(0.6, "it ran")  # the load's reason is the same sentence


def test_a_piece_waits_until_no_request_has_used_the_models_for_a_while():
    clock = FakeClock()
    lock = ModelLock(clock=clock)
    slept = []

    def sleep(s):
        slept.append(s)
        clock.now += s

    step = idle_step(lock, [], idle_s=1.0, sleep=sleep)
    assert step(lambda: "first") == "first" and slept == []  # no request has used the models yet: no wait
    lock.run([], "while generating", lambda: None)  # a request just used the models
    assert step(lambda: "done") == "done"
    assert sum(slept) == pytest.approx(1.0, abs=0.06)  # a second of quiet first
    slept.clear()
    lock.run([], MEASURING, lambda: None)  # a measurement's own piece does not count as use
    assert step(lambda: "again") == "again" and sum(slept) == pytest.approx(0.0, abs=0.06)


def test_a_stopped_measurement_gives_up_at_its_next_piece():
    stop = threading.Event()
    stop.set()
    with pytest.raises(measuring.Superseded):
        idle_step(ModelLock(), [], idle_s=0.0, stop=stop)(lambda: None)


def _blocked_measure(release: threading.Event, busy: str = ""):
    """A measurement that waits for ``release``, then gives the real figures of the tiny pair (with ``busy``)."""
    def measure(target, draft, step):
        release.wait(10)
        checks = measure_pair(target, draft, step)
        return LoadChecks(checks.costs, checks.identity, checks.speed, checks.measured_at, busy=busy)
    return measure


def test_the_pair_answers_before_its_figures_are_in_and_says_so(tmp_path):
    engine = ChatEngine(cache_dir=tmp_path)
    release = threading.Event()
    engine.slot.measurer.measure = _blocked_measure(release)
    engine.slot.measurer.idle_s = 0.0
    engine.slot.install(*tiny_pair(3))  # as load_pair installs: the measurement beside serving
    info = engine.info()
    assert info.measuring and info.costs is None and info.target_speed is None and not info.bit_identical
    assert "measuring" in info.identity_note and info.verify_mode == ""
    done = final_done(engine.generate(HI, GREEDY, SpecConfig(k=4, adaptive=True)))  # served now
    assert len(done.token_ids) == 12 and done.stats.waiting and done.stats.fallback
    assert done.stats.acceptance.proposed == 0  # nothing drafted on a guess: target-only steps
    reference = final_done(engine.generate_reference(HI, GREEDY))
    assert done.token_ids == reference.token_ids
    fixed = final_done(engine.generate(HI, GREEDY, SpecConfig(k=3, adaptive=False)))  # a fixed k is the user's
    assert fixed.stats.acceptance.proposed > 0 and not fixed.stats.waiting
    with pytest.raises(Exception, match="being measured"):
        engine.set_verify_mode("identical")
    release.set()
    info = engine.wait_measured(timeout=60)
    assert not info.measuring and info.costs is not None and info.target_speed.decode_tokens_per_s > 0
    assert "quiet" in info.checks_note
    done = final_done(engine.generate(HI, GREEDY, SpecConfig(k=4, adaptive=True)))
    assert not done.stats.waiting


def test_a_busy_measurement_is_flagged_used_and_not_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(kept_figures, "pair_key", lambda target, draft: "this machine|these files")
    monkeypatch.setattr(measuring, "RETRY_S", 3600.0)  # the retry waits; the test ends first
    engine = ChatEngine(cache_dir=tmp_path)
    clock = FakeClock()
    reads = itertools.count()  # each 10 s on 2 CPUs, this process 2 CPU-seconds, others 15: 75%
    asked = []  # what the step costs' rounds were told: busy, so two rounds are enough

    def costs_told(*args, busy, **kwargs):
        asked.append(busy())
        return measure_step_costs(*args, busy=busy, **kwargs)
    monkeypatch.setattr(measuring, "measure_step_costs", costs_told)

    def busy_measure(target, draft, step):
        watch = CpuWatch(read=lambda: (lambda k: (17.0 * k, 2.0 * k))(next(reads)), clock=clock, cpus=2)
        checks = measure_pair(target, draft, step, watch=_advancing(watch, clock, 10.0))
        return checks
    engine.slot.measurer.measure = busy_measure
    engine.slot.measurer.idle_s = 0.0
    engine.slot.install(*tiny_pair(4))
    info = engine.wait_measured(timeout=60)
    assert info.costs is not None and info.checks_flagged and "busy" in info.checks_note and "75%" in info.checks_note
    assert info.verify_mode in ("", "identical")  # a busy figure never prices the choice toward fastest
    assert not (tmp_path / "measured.json").exists()  # nothing kept
    assert asked == [True]
    engine.slot.measurer.stop()


def _advancing(watch: CpuWatch, clock: FakeClock, seconds: float) -> CpuWatch:
    """``watch``, whose clock moves ``seconds`` between its start and its reading."""
    share = watch.others_share

    def later():
        clock.now += seconds
        return share()
    watch.others_share = later
    return watch


def test_quiet_figures_are_kept_and_the_next_engine_serves_with_them_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(kept_figures, "pair_key", lambda target, draft: "this machine|these files")
    monkeypatch.setattr(measuring, "busy_reason", lambda spread, others: "")  # a quiet machine, whatever the CI's
    first = ChatEngine(cache_dir=tmp_path)
    first.use_models(*tiny_pair(5))
    kept = json.loads((tmp_path / "measured.json").read_text())["this machine|these files"]
    assert set(kept) == {"costs", "identity", "speed", "measured_at"}
    second = ChatEngine(cache_dir=tmp_path)
    second.slot.measurer.measure = lambda *a: pytest.fail("kept figures are not measured again")
    second.slot.install(*tiny_pair(5))
    info = second.info()
    assert not info.measuring and info.costs == first.info().costs and "kept" in info.checks_note
    measured_again = threading.Event()

    def again(*args):
        measured_again.set()
        raise measuring.Superseded()
    second.slot.measurer.measure = again
    second.remeasure()  # the Pair panel's Re-measure: the kept figures go, and the pair measures again
    assert measured_again.wait(10)
    assert second.info().measuring and "this machine|these files" not in json.loads(
        (tmp_path / "measured.json").read_text())


def test_kept_figures_read_back_equal_and_a_damaged_file_is_measured_again(tmp_path, monkeypatch):
    monkeypatch.setattr(kept_figures, "pair_key", lambda target, draft: target)  # the key is the target
    costs_like = tiny_checks()
    store = MeasuredStore(tmp_path / "m.json")
    store.put(("k", "d"), costs_like)
    assert store.get(("k", "d")) == LoadChecks(**{**costs_like.__dict__, "kept": True})
    (tmp_path / "m.json").write_text("{not json")
    assert store.get(("k", "d")) == costs_like.__class__(**{**costs_like.__dict__, "kept": True})  # still in memory
    assert MeasuredStore(tmp_path / "m.json").get(("k", "d")) is None  # a new process: measured again
    (tmp_path / "m.json").write_text(json.dumps({"k": {"costs": {"x": 1}}}))
    assert MeasuredStore(tmp_path / "m.json").get(("k", "d")) is None  # an older shape: measured again
    narrow = costs_like.to_json()
    narrow["costs"]["verify_table"] = [[1, 0.012], [2, 0.014], [16, 0.04]]  # a curve of other widths (up to 16)
    (tmp_path / "m.json").write_text(json.dumps({"k": narrow}))
    assert MeasuredStore(tmp_path / "m.json").get(("k", "d")) is None  # measured again, up to 64
    store.put(("busy", "d"), LoadChecks(**{**costs_like.__dict__, "busy": "others took 80%"}))
    assert store.get(("busy", "d")) is None


def test_a_pair_no_file_names_keeps_its_figures_with_its_loaded_objects(tmp_path):
    """Torch-run models have no file key: their quiet figures hold for those very objects in this process (another
    engine on them is not measured again), never for a new load, and Re-measure drops them."""
    pair = tiny_pair(5)
    first = ChatEngine(cache_dir=tmp_path)
    first.slot.measurer.measure = lambda *a: tiny_checks()
    first.use_models(*pair)
    second = ChatEngine(cache_dir=tmp_path)
    second.slot.measurer.measure = lambda *a: pytest.fail("these loaded objects were measured already")
    second.use_models(*pair)
    assert second.info().costs == first.info().costs and not second.info().measuring
    assert not (tmp_path / "measured.json").exists()  # nothing on disk: no file names these models
    calls = []
    second.slot.measurer.measure = lambda *a: calls.append(a) or tiny_checks()
    second.use_models(*tiny_pair(5))  # a new load of the same model: measured
    second.use_models(*pair)
    second.remeasure()  # Re-measure: the kept figures go
    assert second.wait_measured(timeout=60) and len(calls) == 2
    assert kept_figures.LOADED_PAIRS.get(*pair) is not None  # measured again quietly: kept again


def tiny_checks() -> LoadChecks:
    from engine.costs.costmodel import StepCosts
    from engine.decode.identity import IdentityCheck
    from engine.models.load_checks import STEP_COST_TOKENS

    costs = StepCosts(verify_fixed_s=0.01, verify_per_token_s=0.002, draft_per_token_s=0.004,
                      verify_table=tuple((n, 0.01 + 0.002 * n) for n in STEP_COST_TOKENS), catch_up_per_token_s=0.001)
    identity = IdentityCheck(10, 12, (2, 8), (24,), 1.5, (24, 8, 3), 0.5, "cpu", ((24, 8),), ((24, 10, 12),))
    return LoadChecks(costs, identity, TargetSpeed(10.0, 12.0, 0.2, 32, "runs"), "2026-12-04 12:00")

