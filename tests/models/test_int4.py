"""int4: the GGUF's own 4-bit grid, torch's CPU int4 kernel, and the lossless loop on an int4 target."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.config import SamplingConfig
from engine.models.int4_weight import (GROUP, Int4WeightLinear, affine_groups, dequantize_groups, gguf_affine_groups,
                                       quantize_int4)
from engine.models.loading import wrap_model
from tests.helpers.tiny import tiny_model
from tests.helpers.constants import SMOL

TARGET = "qwen2.5-coder-1.5b-instruct"


def test_affine_groups_put_each_groups_min_and_max_on_the_grid():
    weight = torch.randn(8, 4 * GROUP)
    q, scale, offset = affine_groups(weight)
    assert q.dtype == torch.uint8 and int(q.max()) <= 15 and scale.shape == (8, 4)
    restored = dequantize_groups(q, scale, offset).reshape(8, 4, GROUP)
    groups = weight.reshape(8, 4, GROUP)
    assert torch.allclose(restored.amin(-1), groups.amin(-1), atol=1e-5)
    assert torch.allclose(restored.amax(-1), groups.amax(-1), atol=1e-5)
    assert float((restored - groups).abs().max()) <= float(scale.max()) / 2 + 1e-6  # half a step at most


def test_the_layer_multiplies_by_the_grid_up_to_bf16_scales():
    torch.manual_seed(0)
    q, scale, offset = affine_groups(torch.randn(64, 2 * GROUP))
    layer = Int4WeightLinear(q, scale, offset, bias=None)
    expected = dequantize_groups(q, scale.bfloat16().float(), offset)
    assert torch.allclose(layer.dequantized(), expected, atol=float(scale.max()) * 0.05)
    x = torch.randn(5, 2 * GROUP)
    assert torch.allclose(layer(x).float(), x @ layer.dequantized().T, atol=0.1, rtol=0.02)


@pytest.mark.parametrize("batch", [2, 5, 16])
def test_each_output_row_depends_on_its_own_input_row_only(batch):
    torch.manual_seed(1)
    layer = Int4WeightLinear(*affine_groups(torch.randn(96, 3 * GROUP)), bias=torch.randn(96))
    x = torch.randn(batch, 3 * GROUP).bfloat16()
    together = layer(x)
    assert all(torch.equal(together[i], layer(x[i:i + 1])[0]) for i in range(batch))


def test_without_a_gguf_every_layer_but_the_head_is_quantised_group_wise():
    model = tiny_model(0).bfloat16()
    counts = quantize_int4(model)
    assert counts == {"gguf": 0, "int8": 1, "groups": 14}  # 2 layers x 7 projections; the head keeps int8 rows


def test_int4_target_greedy_speculative_equals_reference():
    """The quantised target is the target: the reference decodes with the same int4 model."""
    from engine.proposers.draft_model import DraftModelProposer
    from engine.decode.kpolicy import FixedK
    from tests.helpers.tiny import cached, reference_done, speculative_done, tiny_pair
    target, draft = tiny_pair(2)
    quantize_int4(target.model.bfloat16())
    target = wrap_model("tiny-int4", "int4", target.model, target.tokenizer)
    sampling = SamplingConfig(max_new_tokens=40, stop_on_eos=False)
    for k in (1, 4):
        spec = speculative_done(target, DraftModelProposer(cached(draft)), FixedK(k), [5, 6, 7], sampling)
        assert spec.token_ids == reference_done(target, [5, 6, 7], sampling).token_ids
        assert 0 < spec.stats.acceptance.accepted < spec.stats.acceptance.proposed


def _gguf_tensor(name: str, kind: str):
    import gguf

    from engine.models.catalog import model_gguf
    reader = gguf.GGUFReader(str(model_gguf(name)))
    return next(t for t in reader.tensors if t.tensor_type.name == kind and t.name.startswith("blk."))


@pytest.mark.real
@pytest.mark.parametrize("name, kind", [(SMOL, "Q4_1"), (TARGET, "Q4_K")])
def test_the_grid_read_from_a_gguf_dequantises_to_ggufs_own_values(name, kind):
    import gguf

    tensor = _gguf_tensor(name, kind)
    q, scale, offset = gguf_affine_groups(tensor)
    assert q.shape == tuple(int(n) for n in reversed(tensor.shape)) and int(q.max()) <= 15
    expected = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
    assert np.array_equal(dequantize_groups(q, scale, offset).numpy(), expected.reshape(q.shape))


@pytest.mark.real
def test_a_gguf_model_keeps_the_files_grid_in_every_4bit_layer():
    import gguf

    from engine.models.catalog import model_gguf
    from engine.models.int8_weight import Int8WeightLinear
    from engine.models.loading import load_model
    model = load_model(SMOL, "bf16").model
    counts = quantize_int4(model, model_gguf(SMOL), fuse=False)
    assert counts == {"gguf": 210, "int8": 1, "groups": 0}  # 30 layers x 7 projections, all Q4_1; the head
    layers = dict(model.named_modules())
    q_proj = layers["model.layers.3.self_attn.q_proj"]  # llama's q rows are permuted in the file: un-permuted here
    assert isinstance(q_proj, Int4WeightLinear) and isinstance(layers["lm_head"], Int8WeightLinear)
    reader = gguf.GGUFReader(str(model_gguf(SMOL)))
    tensor = next(t for t in reader.tensors if t.name == "blk.3.attn_q.weight")
    grid = dequantize_groups(*gguf_affine_groups(tensor))  # the file's rows, permuted
    assert not torch.equal(grid, q_proj.dequantized())
    assert torch.allclose(torch.sort(grid.flatten()).values, torch.sort(q_proj.dequantized().flatten()).values,
                          atol=float(grid.abs().max()) * 2 ** -7)


def test_a_quantised_head_trims_to_the_kept_ids_with_the_same_logits():
    """The fast draft computes logits only for frequent ids; an int8 head (int4 and int8-weight models) cuts too."""
    from engine.backends.torch_runner import ModelRunner
    model = tiny_model(0).bfloat16()
    quantize_int4(model)
    full, trimmed = ModelRunner(model, 48), ModelRunner(model, 48)
    kept = [0, 3, 5, 17, 40]
    trimmed.trim_head(kept)
    a, b = full.forward([1, 2, 3, 4], n_logits=2), trimmed.forward([1, 2, 3, 4], n_logits=2)
    assert torch.equal(a[:, kept], b[:, kept])
    assert torch.isinf(b[:, [1, 2, 4]]).all()
