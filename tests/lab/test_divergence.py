"""Where two greedy answers differ, the target's margin there, and the fp32 proof (tiny models; SmolLM2 marked)."""
from __future__ import annotations

import pytest
import torch

from engine.config import CACHE_OFF, SamplingConfig, SpecConfig
from engine.divergence import Divergence, first_divergence, top_logits
from engine.precision import rounding_step
from engine.chat_engine import ChatEngine
from engine.backends.contract import common_prefix
from engine.events import final_done
from tests.helpers.tiny import tiny_pair
from tests.helpers.constants import SMOL


def divergence(margin: float, gap: float | None, precision: str = "bf16", top: float = 20.0) -> Divergence:
    return Divergence(position=3, reference_token=5, other_token=6, reference_text="a", other_text="b",
                      top_logit=top, top2_margin=margin, tokens_gap=gap, precision=precision,
                      rounding_step=rounding_step(precision, top))


def test_rounding_step_is_the_spacing_of_the_precision():
    assert rounding_step("bf16", 20.0) == 0.125  # 16 <= 20 < 32: 2^(4-7)
    assert rounding_step("bf16", -3.0) == 2.0 ** (1 - 7)
    assert rounding_step("fp32", 20.0) == 2.0 ** (4 - 23)


def test_a_tie_is_within_rounding_and_a_wide_margin_is_not():
    assert divergence(0.125, 0.125).within_rounding
    assert not divergence(0.125, 3.0).within_rounding  # the two tokens were not the near-tied pair
    assert not divergence(2.5, 2.5).within_rounding
    assert not divergence(0.125, 0.125, precision="fp32").within_rounding  # fp32 steps are 2^-19 here
    assert divergence(0.1, None).to_dict()["within_rounding"]


def test_first_divergence_on_a_tiny_model_reads_the_targets_logits():
    target, _ = tiny_pair(0)
    prompt, reference = [5, 6, 7], [8, 9, 10, 11]
    assert first_divergence(target, prompt, reference, list(reference)) is None
    div = first_divergence(target, prompt, reference, [8, 9, 12, 11])
    assert (div.position, div.reference_token, div.other_token) == (2, 10, 12)
    logits = top_logits(target, prompt + reference[:2])
    top2 = torch.topk(logits, 2).values
    assert div.top2_margin == pytest.approx(float(top2[0] - top2[1]))
    assert div.tokens_gap == pytest.approx(abs(float(logits[10] - logits[12])))
    ended = first_divergence(target, prompt, reference, reference[:3])
    assert (ended.position, ended.other_token, ended.other_text) == (3, None, "(end of answer)")


def test_engine_explains_and_proves_on_an_fp32_pair(monkeypatch):
    import engine.serve.pair_slot

    def no_load(*args, **kwargs):
        raise AssertionError("an fp32 pair needs no fp32 copies")

    monkeypatch.setattr(engine.serve.pair_slot, "load_model", no_load)
    target, draft = tiny_pair(1)
    engine = ChatEngine()
    engine.use_models(target, draft)
    messages, sampling = [{"role": "user", "content": "abc"}], SamplingConfig(max_new_tokens=12)
    proof = engine.prove_fp32(messages, sampling, SpecConfig(k=3))
    assert proof.identical and proof.divergence is None and proof.n_tokens > 0
    div = engine.explain_divergence(messages, [1, 2, 3], [1, 4, 3])
    assert div.position == 1 and div.precision == "fp32"


# -- SmolLM2-135M in bf16: near-ties ----------------------------------------------------------------------------
# Target-only vs speculative (draft = the same model, k=4, greedy). Whether a bf16 near-tie flips, and where,
# depends on the CPU's (or GPU's) kernels, so the test names no position: it asserts what holds on every device:
# no divergence, or one that is a tie within rounding; and fp32 (on the CPU) is identical.
TIE_PROMPTS = ("Write a Python function that checks whether a number is prime.",
               "Explain the difference between TCP and UDP in two sentences.")


@pytest.mark.real
@pytest.mark.parametrize("prompt", TIE_PROMPTS)
def test_bf16_divergence_is_a_rounding_tie_and_fp32_is_identical(real_models, prompt):
    engine = real_models.engine(SMOL, "bf16", SMOL, "bf16")
    messages, sampling = [{"role": "user", "content": prompt}], SamplingConfig(max_new_tokens=20)
    spec = SpecConfig(k=4)
    reference = final_done(engine.generate_reference(messages, sampling)).token_ids
    other = final_done(engine.generate(messages, sampling, spec, cache=CACHE_OFF)).token_ids
    div = engine.explain_divergence(messages, list(reference), list(other))
    if reference == other:
        assert div is None
    else:
        assert div.position == common_prefix(list(reference), list(other))
        assert div.reference_token != div.other_token and div.precision == "bf16"
        assert div.within_rounding and div.top2_margin <= 4 * div.rounding_step, div
    proof = engine.prove_fp32(messages, sampling, spec)
    assert proof.identical and 0 < proof.n_tokens <= 20 and proof.divergence is None
