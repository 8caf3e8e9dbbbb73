"""The cost model, the adaptive k on synthetic timings, and the machine classification behind ``auto``."""
from dataclasses import replace
from pathlib import Path

import pytest

from engine.costs.costmodel import CostFit, StepCosts, expected_tokens, fit_line
from engine.models.auto import CPU_CHOICES, describe
from engine.models.hardware import MACHINE_KINDS, classify
from engine.precision import EXPECTED, precision
from engine.config import FREE_SPAN
from engine.decode.kpolicy import ALPHA_CEILING, AdaptiveK, FixedK
from engine.decode.step import StepRecord

ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_vnni"})
SAPPHIRE_RAPIDS = ZEN4 | {"amx_bf16", "amx_tile", "amx_int8"}
HASWELL = frozenset({"avx2", "fma"})
REPO = Path(__file__).resolve().parents[2]


def model_step(n_accepted: int, n_drafted: int, draft_s: float, verify_s: float, n_fed: int,
               caught_up: int = 0) -> StepRecord:
    """A step whose draft a draft model made, after feeding ``caught_up`` tokens it had missed."""
    return StepRecord(n_drafted=n_drafted, n_accepted=n_accepted, n_fed=n_fed, draft_s=draft_s, verify_s=verify_s,
                      draft_fed=caught_up + n_drafted if n_drafted else 0)


def free_limit(policy) -> int | None:
    """How long the step's budget lets a free draft of up to FREE_SPAN tokens be (the steps below name no evidence)."""
    return policy.budget().price("", FREE_SPAN)


def run_policy(policy, accept, draft_s_per_token: float, verify, steps: int = 40) -> list[int]:
    """Feed synthetic steps: ``accept(k)`` draft tokens kept, ``verify(n_fed)`` seconds per target forward.
    Returns the k chosen at each step."""
    policy.update(model_step(0, 4, draft_s=9.0, verify_s=9.0, n_fed=40))  # the first step includes the prefill: ignored
    ks = []
    for _ in range(steps):
        k = policy.budget().k
        ks.append(k)
        policy.update(model_step(accept(k), k, draft_s=draft_s_per_token * k, verify_s=verify(k + 1), n_fed=k + 1))
    return ks


def test_flat_verify_cost_and_perfect_drafts_draft_long():
    ks = run_policy(AdaptiveK(k_init=4, k_max=16), lambda k: k, 0.005, verify=lambda n: 0.2)
    assert min(ks[-10:]) >= 12


def test_same_acceptance_long_k_when_verify_is_flat_short_when_it_grows_with_n():
    """alpha ~ 0.75 (the draft is wrong at its 4th token); same cost at n = 4, flat vs growing with n."""
    flat = run_policy(AdaptiveK(k_init=4, k_max=16), lambda k: min(k, 3), 0.005, verify=lambda n: 0.27)
    linear = run_policy(AdaptiveK(k_init=4, k_max=16), lambda k: min(k, 3), 0.005,
                        verify=lambda n: 0.15 + 0.03 * n)
    assert min(flat[-10:]) >= 6
    assert 1 <= min(linear[-10:]) and max(linear[-10:]) <= 4


def test_compute_bound_verify_stops_speculating():
    """Verify cost proportional to the tokens fed (bf16 without native kernels): drafting cannot pay."""
    ks = run_policy(AdaptiveK(k_init=4, k_max=16, probe_every=8), lambda k: min(k, 3), 0.005,
                    verify=lambda n: 0.1 * n)
    assert ks[-10:].count(0) >= 8


def test_linear_verify_cost_is_learned_without_a_prior_once_k_moves():
    policy = AdaptiveK(k_init=8, k_max=16)
    policy.update(model_step(0, 8, 1.0, 1.0, n_fed=40))
    for k in (8, 2, 5, 1, 12):
        policy.update(model_step(k, k, draft_s=0.005 * k, verify_s=0.03 + 0.1 * (k + 1), n_fed=k + 1))
    costs = policy.costs
    assert costs.verify_per_token_s == pytest.approx(0.1, rel=1e-6)
    assert costs.verify_fixed_s == pytest.approx(0.03, rel=1e-6)


def test_low_acceptance_falls_back_to_target_steps_with_probes():
    losing = AdaptiveK(k_init=4, probe_every=3)
    losing.update(model_step(0, 4, 9.0, 9.0, n_fed=40))
    for _ in range(10):
        losing.update(model_step(0, 4, draft_s=0.4, verify_s=0.2, n_fed=5))  # expensive draft, always wrong
    choices = [losing.budget() for _ in range(6)]
    ks = [c.k for c in choices]
    assert ks.count(0) >= 4 and max(ks) > 0
    assert all(c.fallback for c in choices)  # the probes between plain target steps too


def test_choices_say_fallback_only_when_speculation_loses():
    winning = AdaptiveK(k_init=4, prior=StepCosts(0.2, 0.0, 0.005))
    choice = winning.budget()
    assert choice.k > 0 and not choice.fallback
    fixed = FixedK(3).budget()
    assert (fixed.k, fixed.fallback, fixed.why) == (3, False, "fixed k 3")


def test_prior_alone_decides_before_any_step():
    flat = AdaptiveK(k_init=4, k_max=16, prior=StepCosts(0.2, 0.0, 0.005))
    steep = AdaptiveK(k_init=4, k_max=16, prior=StepCosts(0.03, 0.1, 0.005))
    flat.accepted, steep.accepted = 50.0, 50.0  # as if the draft had been right 50 times in a row
    assert flat.budget().k > steep.budget().k >= 1


def test_prior_keeps_the_slope_when_k_never_moves():
    fit = CostFit(StepCosts(0.03, 0.1, 0.005))
    fit.observe(40, 9.0, 4, 1.0)
    for _ in range(20):
        fit.observe(5, 0.53, 4, 0.02)
    costs = fit.costs()
    assert costs.verify_s(5) == pytest.approx(0.53, rel=0.05)
    assert costs.verify_per_token_s > 0.05


def test_fixed_k_reports_costs_but_keeps_k():
    policy = FixedK(3)
    assert policy.costs is None
    policy.update(model_step(3, 3, 9.0, 9.0, n_fed=30))
    policy.update(model_step(3, 3, 0.03, 0.4, n_fed=4))
    assert policy.budget().k == 3 and policy.costs.draft_per_token_s == pytest.approx(0.01)


def test_step_costs_speedup_and_best_k():
    flat = StepCosts(verify_fixed_s=0.1, verify_per_token_s=0.0, draft_per_token_s=0.01)
    assert flat.speedup(0.9, 0) == pytest.approx(1.0)
    assert flat.speedup(1.0, 4) == pytest.approx(5 * 0.1 / (0.04 + 0.1))
    assert flat.best_k(0.0, [0, 1, 2]) == 0
    linear = StepCosts(0.0, 0.1, 0.0)  # verify cost proportional to tokens fed: drafting can never win
    assert linear.speedup(0.99, 8) < 1.0 and linear.best_k(0.99, [0, 1, 2, 4, 8]) == 0


def test_fit_line_recovers_a_line_and_is_flat_for_one_n():
    assert fit_line([1, 2, 4, 8], [0.3, 0.4, 0.6, 1.0]) == pytest.approx((0.2, 0.1))
    assert fit_line([5, 5, 5], [1.0, 2.0, 3.0]) == pytest.approx((2.0, 0.0))
    a, b = fit_line([1, 8], [0.5, 0.4])  # noise sloping down: no negative per-token cost
    assert b == 0.0 and a == pytest.approx(0.45)


def test_expected_tokens_formula():
    assert expected_tokens(0.0, 5) == 1.0
    assert expected_tokens(1.0, 5) == 6.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize("cuda, capability, flags, isa, kind", [
    (True, "AVX2", HASWELL, "", "cuda"),
    (False, "AVX512", SAPPHIRE_RAPIDS, "", "amx"),
    (False, "AVX512", ZEN4, "", "avx512-bf16"),
    (False, "AVX512", frozenset({"avx2", "avx512f", "avx512_vnni"}), "", "avx512"),
    (False, "AVX2", HASWELL, "", "avx2"),
    (False, "AVX2", ZEN4, "AVX2", "avx2"),  # the emulation used for the AVX2 numbers
    (False, "AVX512", ZEN4, "AVX2", "avx2"),  # oneDNN capped: bf16 matmuls are not native any more
    (False, "AVX512", SAPPHIRE_RAPIDS, "AVX512_CORE_BF16", "avx512-bf16"),  # AMX switched off in oneDNN
    (False, "DEFAULT", HASWELL, "", "baseline"),
])
def test_machine_kind_from_features(cuda, capability, flags, isa, kind):
    assert classify(cuda, capability, flags, isa).kind == kind


def test_auto_cpu_choices_per_machine_kind():
    assert set(CPU_CHOICES) == set(MACHINE_KINDS) - {"cuda", "mps"}  # the GPUs: engine/models/devices.py, by memory
    avx2 = classify(False, "AVX2", HASWELL)
    assert CPU_CHOICES[avx2.kind].target == "int8-weight"  # no native bf16 on AVX2: int8 weights
    assert all(CPU_CHOICES[classify(False, "AVX512", f).kind].target != "int8-dynamic" for f in (ZEN4, HASWELL))
    # every CPU target is expected batch-invariant: greedy speculation is bit-for-bit the target's on every CPU kind
    assert all(precision(c.target).batch_invariance == EXPECTED for c in CPU_CHOICES.values())
    assert CPU_CHOICES[classify(False, "AVX512", ZEN4).kind].target == "int4"  # AVX-512: the GGUF's 4-bit grid
    note = describe(avx2, {"target": "int8-dynamic", "draft": "int8-dynamic"}, {"target"}, [])
    assert note.startswith("AVX2 CPU") and "target int8-dynamic (auto)" in note
    assert "draft int8-dynamic (chosen)" in note


def test_avx2_emulation_env_is_detected_as_avx2():
    import os
    import subprocess
    import sys
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    out = subprocess.run([sys.executable, "-m", "tests.helpers.machine_kind"], cwd=REPO, env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["avx2"]


def _policy_with_costs(verify_fixed_s: float, verify_per_token_s: float) -> AdaptiveK:
    return AdaptiveK(prior=StepCosts(verify_fixed_s=verify_fixed_s, verify_per_token_s=verify_per_token_s,
                                     draft_per_token_s=0.02))


def test_free_drafts_are_capped_where_each_verified_token_costs_and_long_where_verify_is_flat():
    compute_bound, flat = _policy_with_costs(0.35, 0.08), _policy_with_costs(0.35, 0.001)
    assert 1 <= free_limit(compute_bound) <= 6  # a = 0.35 s, b = 0.08 s, acceptance prior 0.8: 4
    assert free_limit(flat) >= 3 * free_limit(compute_bound)
    for _ in range(10):  # lookups that keep failing at once: none pays, so the steps are target-only
        compute_bound.update(StepRecord(n_drafted=8, n_accepted=0, n_fed=9, draft_s=0.0, verify_s=0.35 + 0.08 * 9,
                                        free=True))
    limits = [free_limit(compute_bound) for _ in range(8 + 16 + 32)]
    assert limits.count(1) == 3 and set(limits) == {0, 1}  # one-token probes after 8, then 16, then 32 losing steps
    assert [i for i, n in enumerate(limits) if n] == [7, 23, 55]


def test_a_probe_that_pays_brings_the_free_drafts_back():
    policy = _policy_with_costs(0.35, 0.08)
    for _ in range(10):
        policy.update(StepRecord(n_drafted=8, n_accepted=0, n_fed=9, draft_s=0.0, verify_s=1.07, free=True))
    assert free_limit(policy) == 0
    for _ in range(6):  # lookups that were right after all
        policy.update(StepRecord(n_drafted=4, n_accepted=4, n_fed=5, draft_s=0.0, verify_s=0.75, free=True))
    assert free_limit(policy) >= 2


def test_fixed_k_prices_free_drafts_too():
    """A fixed k (the bench's lookup mode, a user's k) bounds a lookup; the cost model still cuts what does not pay."""
    fixed = FixedK(16, prior=StepCosts(0.35, 0.08, 0.02))
    assert 1 <= free_limit(fixed) <= 6
    for _ in range(10):
        fixed.update(StepRecord(n_drafted=8, n_accepted=0, n_fed=9, draft_s=0.0, verify_s=1.07, free=True))
    assert free_limit(fixed) == 0


def test_a_losing_draft_model_is_probed_less_and_less_often():
    """A draft that could pay here (cheap, flat verify) but is always wrong: probed after 4, 8, 16 losing steps."""
    losing = AdaptiveK(k_init=4, probe_every=4, prior=StepCosts(0.2, 0.0, 0.02))
    for _ in range(10):
        losing.update(model_step(0, 4, draft_s=0.08, verify_s=0.2, n_fed=5))
    ks = [losing.budget().k for _ in range(4 + 8 + 16)]
    assert [i for i, k in enumerate(ks) if k] == [3, 11, 27]


def test_where_no_draft_could_pay_the_draft_model_never_runs_not_even_a_probe():
    """The 2-core physics (a draft token 0.45 of a target token, t(2) = 1.46, t(4) = 2.06): a draft accepted 9 times
    in 10 would gain 2% a token, which never pays back catching the draft up on a 300-token prompt within a
    200-token answer; so no acceptance it could measure would change the decision, and nothing is probed. A draft
    that costs more than a target token could not pay at all, whatever it is behind."""
    t1 = 0.047
    two_cores = StepCosts(0.0, 0.0, 0.45 * t1, verify_table=((1, t1), (2, 1.46 * t1), (4, 2.06 * t1), (8, 4.46 * t1)),
                          catch_up_per_token_s=0.2 * t1)
    assert 1.0 < max(two_cores.speedup(ALPHA_CEILING, k) for k in range(1, 9)) < 1.05
    paused = AdaptiveK(k_init=4, probe_every=2, prior=two_cores)
    assert all(c.k == 0 and c.fallback for c in (paused.budget(remaining=200, behind=300) for _ in range(200)))
    dearer = replace(two_cores, draft_per_token_s=1.1 * t1)
    assert max(dearer.speedup(ALPHA_CEILING, k) for k in range(1, 9)) < 1.0
    never = AdaptiveK(k_init=4, probe_every=2, prior=dearer)
    assert all(c.k == 0 and c.fallback for c in (never.budget(remaining=10_000) for _ in range(200)))


def test_a_catch_up_is_drafted_only_where_the_rest_of_the_answer_pays_for_it():
    """A draft model 300 tokens behind (a new answer's prompt) at 5 ms a token to catch up: 1.5 s. A good draft saves
    some ms a token: worth it for a long answer, not for the last few tokens."""
    costs = StepCosts(0.05, 0.0, 0.004, catch_up_per_token_s=0.005)
    policy = AdaptiveK(k_init=4, prior=costs)
    policy.accepted, policy.rejected = 9.0, 1.0
    saving = costs.saving_per_token_s(0.9, policy._paying_k(costs, 0.9, None, 300) or 4)
    assert saving > 0 and costs.catch_up_s(300) == pytest.approx(1.5)
    assert policy.budget(remaining=int(1.5 / saving) - 5, behind=300).k == 0
    assert policy.budget(remaining=int(1.5 / saving) + 50, behind=300).k > 0
    assert policy.budget(remaining=int(1.5 / saving) - 5, behind=1).k > 0  # a draft that resumed: little to catch up
    # the draft caught up on 300 tokens, then drafted 4 (what it fed, Draft.fed, says so)
    policy.update(model_step(4, 4, draft_s=1.5 + 4 * 0.004, verify_s=0.05, n_fed=5, caught_up=300))
    assert policy.catch_up_per_token_s == pytest.approx(0.005)
    assert policy.costs.draft_per_token_s == pytest.approx(0.004)  # the catch-up did not count as drafting


INT4_CURVE = ((1, 0.034), (2, 0.043), (4, 0.050), (8, 0.096), (16, 0.182))  # a 4-bit 1.5B target, measured


def test_a_measured_curve_prices_each_verify_length_where_the_line_cannot():
    a, b = fit_line([n for n, _ in INT4_CURVE], [t for _, t in INT4_CURVE])
    line = StepCosts(a, b, 0.012)
    curve = StepCosts(a, b, 0.012, verify_table=INT4_CURVE)
    assert curve.verify_s(4) == pytest.approx(0.050) and curve.verify_s(3) == pytest.approx(0.0465)
    assert curve.verify_s(32) > curve.verify_s(16) > curve.verify_s(8)  # extended by the last segment
    assert abs(line.verify_s(4) - 0.050) > 0.005  # the straight line misprices the flat start
    assert curve.best_k(0.9, list(range(0, 17))) == 3  # the knee: 4 tokens fed cost little more than 1
    assert curve.best_k(0.5, list(range(0, 17))) == 0  # low acceptance: plain target steps


def test_the_online_fit_keeps_the_calibrated_curve_and_moves_with_observations():
    fit = CostFit(StepCosts(0.03, 0.01, 0.012, verify_table=INT4_CURVE))
    assert fit.costs().verify_table == INT4_CURVE
    fit.observe(5, 0.2, 4, 0.05)  # the first step prefills: ignored
    for _ in range(20):
        fit.observe(5, 0.080, 4, 0.048)
    costs = fit.costs()
    assert dict(costs.verify_table)[5] == pytest.approx(0.080, rel=0.1)
    times = [t for _, t in costs.verify_table]
    assert times == sorted(times)  # never cheaper for a longer forward


def test_load_time_costs_are_measured_until_two_rounds_agree():
    from engine.models.load_checks import agreed_costs

    rounds = iter([{1: 0.080, 2: 0.150}, {1: 0.040, 2: 0.075}, {1: 0.042, 2: 0.077}, {1: 0.5, 2: 0.5}])
    costs, n, spread = agreed_costs(lambda: next(rounds))
    assert n == 3 and spread <= 0.1 and costs == {1: 0.040, 2: 0.075}  # a busy first round dropped; the agreeing min
    noisy = iter([{1: 0.1 * (i + 1)} for i in range(10)])
    costs, n, spread = agreed_costs(lambda: next(noisy), max_rounds=4)
    assert n == 4 and spread == pytest.approx(0.098 / 0.3) and costs == {1: pytest.approx(0.4)}  # never agreeing
    tiny = iter([{1: 0.003}, {1: 0.0045}])  # a tiny model's forwards: a millisecond apart is noise, not load
    costs, n, spread = agreed_costs(lambda: next(tiny))
    assert n == 2 and spread == 0.0 and costs == {1: 0.003}
    busy = iter([{1: 0.1}, {1: 0.2}, {1: 0.3}])  # rounds that will be flagged anyway: two are enough
    costs, n, spread = agreed_costs(lambda: next(busy), busy=lambda: True)
    assert n == 2 and spread == pytest.approx(0.098 / 0.1) and costs == {1: 0.1}
