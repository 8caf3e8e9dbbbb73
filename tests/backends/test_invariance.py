"""Batch invariance (the property behind bit-for-bit greedy identity): every row of a k-token verify forward
equals the same token fed alone, for k in 1..16, at a short and a long context.

Invariant on CPU: int8-weight and int4 (their kernels compute each output row from its own input row) with
row-exact attention (engine/models/attention.py; eager attention's softmax(QK^T) @ V is not, at the 1.5B's
sizes). Identical only up to ties: fp32 (MKL's GEMM blocks by row count) and bf16 (oneDNN's bf16 GEMM likewise); their
drift is bounded by their records' tie_steps (engine/precision.py). int8-dynamic shares one activation scale across the
rows, so auto never makes it the target (engine/models/auto.py).
"""
from __future__ import annotations

import pytest
import torch

from engine.models.int4_weight import quantize_int4
from engine.models.int8_weight import quantize_int8_weight
from engine.models.loading import attention_for
from engine.precision import EXPECTED, RECORDS, precision as record
from tests.helpers.invariance import steps_off, verify_vs_alone
from tests.helpers.tiny import tiny_model
from tests.helpers.constants import SMOL
EXPECTED_INVARIANT = sorted(p.name for p in RECORDS.values() if p.batch_invariance == EXPECTED)


def _tiny(precision: str):
    model = tiny_model(0)
    model.set_attn_implementation(attention_for(torch.device("cpu")))
    if precision == "int8-weight":
        return quantize_int8_weight(model.bfloat16())
    if precision == "int4":
        quantize_int4(model.bfloat16())
        return model
    return model.bfloat16() if precision == "bf16" else model


@pytest.mark.parametrize("precision", EXPECTED_INVARIANT)
@pytest.mark.parametrize("context", [3, 300])
def test_tiny_invariant_precisions_give_equal_logits_in_any_verify_shape(precision, context):
    gaps = verify_vs_alone(_tiny(precision), 48, context)
    assert all(torch.equal(gap, torch.zeros_like(gap)) for gap in gaps.values()), \
        {k: float(g.max()) for k, g in gaps.items() if g.max() > 0}


@pytest.mark.real
@pytest.mark.parametrize("precision", ["int4", "int8-weight", "bf16", "fp32"])
@pytest.mark.parametrize("context", [8, 600])
def test_smollm2_verify_rows_equal_rows_fed_alone(real_models, precision, context):
    loaded = real_models.model(SMOL, precision)
    assert loaded.model.config._attn_implementation == attention_for(torch.device("cpu"))
    drift = steps_off(loaded.model, loaded.vocab_size, context, precision)
    if precision in EXPECTED_INVARIANT:
        assert drift == 0.0
    else:  # identical up to ties: listed, and bounded
        assert drift <= record(precision).tie_steps, drift


@pytest.mark.real
@pytest.mark.parametrize("name", ["qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"])
@pytest.mark.parametrize("context", [8, 600])
def test_the_shipped_models_verify_rows_equal_rows_fed_alone(real_models, name, context):
    """At the shipped models' own sizes (hidden 1536 / 896, MLP 8960 / 4864, 12 / 14 heads), at a short and a long
    context: every row of a verify of width up to 9 equals the same token fed alone. Eager attention can fail this
    on a CPU (its kernels block the inner dimension by the key count); row-exact attention
    (engine/models/attention.py) computes each row as alone."""
    loaded = real_models.model(name, "int8-weight")
    gaps = verify_vs_alone(loaded.model, loaded.vocab_size, context, max_k=9)
    assert all(torch.equal(gap, torch.zeros_like(gap)) for gap in gaps.values()), \
        {k: float(g.max()) for k, g in gaps.items() if g.max() > 0}


@pytest.mark.real
def test_sdpa_would_break_it_on_smollm2():
    """Why not sdpa: the same int4 SmolLM2 with torch's sdpa attention is not batch-invariant."""
    from engine.models.loading import load_model
    loaded = load_model(SMOL, "int4")
    loaded.model.set_attn_implementation("sdpa")
    assert steps_off(loaded.model, loaded.vocab_size, 600, "int4") > 0.0
    loaded.model.set_attn_implementation(attention_for(torch.device("cpu")))
    assert steps_off(loaded.model, loaded.vocab_size, 600, "int4") == 0.0
