"""Identity measured at load (engine/decode/identity.py): what the pair info, the race, /v1 and the bench claim is
what the check found on this machine, for torch and llama.cpp runners alike."""
from __future__ import annotations

import pytest
import torch

from engine.decode.identity import IdentityCheck, measure_identity
from engine.backends.torch_runner import ModelRunner
from engine.models.attention import ROW_EXACT
from engine.models.load_checks import IDENTITY_PROMPT, check_identity
from engine.models.int8_weight import quantize_int8_weight
from tests.helpers.tiny import tiny_model
from tests.helpers.constants import SMOL

TARGET = "qwen2.5-coder-1.5b-instruct"
TEXT = [(7 * i + 3) % 40 + 2 for i in range(400)]  # a tiny model's "prompt"


def _tiny(precision: str):
    model = tiny_model(0)
    model.set_attn_implementation(ROW_EXACT)
    if precision == "int8-weight":
        return quantize_int8_weight(model.bfloat16())
    if precision == "int8-dynamic":
        return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
    return model


def test_the_check_counts_every_row_of_every_width_and_position():
    check = measure_identity(ModelRunner(_tiny("int8-weight"), 48), TEXT, "int8-weight",
                             widths=(2, 3, 5), positions=(4, 40))
    assert check.rows == 2 * ((2 + 1) + (3 + 1) + (5 + 1))  # each width's rows, plus one token fed alone after it
    assert check.identical and check.rows_equal == check.rows and check.max_drift_steps == 0.0
    assert check.describe().startswith(f"verified bit-identical on this machine: {check.rows}/{check.rows} rows")


def test_a_context_too_short_for_every_position_measures_nothing_and_says_so():
    check = measure_identity(ModelRunner(_tiny("fp32"), 48), TEXT, "fp32", widths=(2, 3), positions=())
    assert check.rows == 0 and not check.identical
    assert check.describe().startswith("not measured")


def test_a_runner_whose_rows_depend_on_the_batch_is_found_out():
    """int8-dynamic shares one activation scale across a forward's rows: the check must see it."""
    check = measure_identity(ModelRunner(_tiny("int8-dynamic"), 48), TEXT, "int8-dynamic",
                             widths=(2, 4, 8), positions=(4, 40))
    assert not check.identical and check.rows_equal < check.rows and check.max_drift_steps > 0
    assert check.first_unequal is not None
    text = check.describe()
    assert text.startswith("identical up to rounding ties (max drift") and f"/{check.rows} rows equal" in text
    assert "the same prompt may get another answer on a busy machine" in text  # the pair line and race mode say it


def _check(unequal: tuple[tuple[int, int], ...], widths=(2, 3, 4, 5, 6, 7, 8, 9, 17)) -> IdentityCheck:
    rows = 2 * sum(w + 1 for w in widths)
    bad = sum(w + 1 for _, w in unequal)
    return IdentityCheck(rows - bad, rows, widths, (24, 256), 1.5 if unequal else 0.0,
                         (24, unequal[0][1], 0) if unequal else None, 1.0, unequal=unequal)


def test_the_widest_identical_verify_caps_an_adaptive_k_and_the_note_says_where_identity_ends():
    """llama.cpp's K-quant matmul takes its tiled kernel from 8 rows: verifies up to 7 tokens are the tokens fed
    alone, wider ones only up to ties. The adaptive k then keeps to k <= 6, and the pair line says both."""
    from engine.config import SpecConfig
    from engine.decode.kpolicy import policy_for

    tiled = _check(((24, 8), (24, 9), (256, 8), (24, 17)))
    assert tiled.identical_width == 7 and tiled.width_cap == 7 and not tiled.identical
    note = tiled.describe()
    assert note.startswith("verified bit-identical on this machine for verify widths up to 7 (k <= 6")
    assert "from width 8 identical up to rounding ties" in note
    assert _check(()).width_cap is None and _check(()).identical_width == 17  # all identical: nothing to cap
    assert _check(((24, 2),)).identical_width == 0 and _check(((24, 2),)).width_cap is None
    assert _check(((256, 3),)).width_cap == 2  # width 2 alone: k = 1

    # the step budget keeps a verify within the width: k <= 6 beside the step's newest token; nothing is drafted
    # while the target has more than that token to take (the prompt is fed alone, as the reference feeds it)
    adaptive = policy_for(SpecConfig(k=4, proposer="hybrid", adaptive=True, k_max=16), width=7)
    assert adaptive.k_max == 6 and policy_for(SpecConfig(k=8, adaptive=True, k_min=7), width=7).k_min == 6
    one, three, prefill = (adaptive.budget(remaining=100, unseen=n) for n in (1, 3, 30))
    assert (one.span, three.span, three.k, prefill.span, prefill.k) == (6, 0, 0, 0, 0)
    assert "verify width <= 7" in one.why and "the prompt's 3 tokens are fed alone first" in three.why
    assert policy_for(SpecConfig(k=10), width=None).budget(remaining=100).k == 10  # a fixed k is the user's choice
    assert policy_for(SpecConfig(k=4, adaptive=True, k_max=16)).k_max == 16


def test_the_check_leaves_the_runner_empty_and_repeats_a_short_prompt():
    runner = ModelRunner(_tiny("fp32"), 48)
    check = measure_identity(runner, TEXT[:10], "fp32", widths=(2,), positions=(30,))  # 10 ids, repeated to 33
    assert runner.tokens == [] and check.rows == 3


@pytest.mark.real
def test_smollm2_pair_info_carries_what_the_check_measured(real_models):
    engine = real_models.engine(SMOL, "int8-weight", SMOL, "int8-dynamic")
    info = engine.info()
    measured = check_identity(engine.target)
    assert isinstance(measured, IdentityCheck) and measured.rows > 0
    assert info.bit_identical == measured.identical and info.identity_note == measured.describe()
    assert info.identity_drift_steps == measured.max_drift_steps


@pytest.mark.real
def test_the_1_5b_target_is_bit_identical_in_every_verify_width_with_row_exact_attention(real_models):
    """With eager attention the 1.5B int8-weight target's verify rows can differ from the tokens fed alone
    (softmax(QK^T) @ V blocks its inner dimension by the key count on some CPUs). Row-exact attention computes
    each row as alone; this checks every width the loop verifies, on the real prompt, at a short and a long
    position."""
    loaded = real_models.model(TARGET, "int8-weight")
    assert loaded.model.config._attn_implementation == ROW_EXACT
    check = check_identity(loaded)
    assert check.identical, check.describe()
    assert IDENTITY_PROMPT.count("\n") >= 20  # the check's prompt is a real edit request, as people send


@pytest.mark.real
def test_the_identity_bench_measures_a_torch_precision(tmp_path):
    import json

    from bench.speed.identity import main
    out = tmp_path / "identity.json"
    main(["--model", SMOL, "--precision", "int8-weight", "--widths", "2,5", "--positions", "8", "--json", str(out)])
    [row] = json.loads(out.read_text())["rows"]
    assert row["setting"] == "int8-weight" and row["rows"] == 3 + 6 and row["identical"]


@pytest.mark.parametrize("args, expected", [(["--widths", "1-3"], "--widths"), (["--positions", "0"], "--positions"),
                                            (["--cost-contexts", "24,x"], "--cost-contexts"),
                                            (["--cost-contexts", "9000"], "--cost-contexts"),
                                            (["--precision", "int3"], "unknown precision")])
def test_the_identity_bench_refuses_bad_arguments(args, expected, capsys):
    from bench.speed.identity import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", SMOL, *args])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err
