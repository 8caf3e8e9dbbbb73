"""Fused q/k/v and gate/up give the very logits of the separate projections, with fewer matmul calls."""
from __future__ import annotations

import pytest
import torch

from engine.backends.torch_runner import ModelRunner
from engine.models.fuse import FusedMLP, FusedQKV
from engine.models.int4_weight import quantize_int4
from tests.helpers.tiny import tiny_model
from tests.helpers.constants import SMOL


def _logits(model, vocab: int) -> list[torch.Tensor]:
    runner = ModelRunner(model, vocab)
    return [runner.forward(list(range(3, 40)), n_logits=1), runner.forward([5], n_logits=1),
            runner.forward([7, 8, 9, 10, 11], n_logits=5)]


def _fused_and_not(make):
    fused, separate = make(), make()
    quantize_int4(fused, fuse=True)
    quantize_int4(separate, fuse=False)
    return fused, separate


def test_tiny_fused_projections_give_the_same_logits_bit_for_bit():
    fused, separate = _fused_and_not(lambda: tiny_model(0).bfloat16())
    kinds = [type(m) for m in fused.modules()]
    assert kinds.count(FusedQKV) == 2 and kinds.count(FusedMLP) == 2
    assert all(torch.equal(a, b) for a, b in zip(_logits(fused, 48), _logits(separate, 48)))


@pytest.mark.real
def test_smollm2_fused_int4_gives_the_same_logits_bit_for_bit():
    from engine.models.catalog import model_gguf
    from engine.models.loading import load_model
    loaded = [load_model(SMOL, "bf16") for _ in range(2)]
    quantize_int4(loaded[0].model, model_gguf(SMOL), fuse=True)
    quantize_int4(loaded[1].model, model_gguf(SMOL), fuse=False)
    assert sum(isinstance(m, FusedQKV) for m in loaded[0].model.modules()) == 30
    vocab = loaded[0].vocab_size
    assert all(torch.equal(a, b) for a, b in zip(_logits(loaded[0].model, vocab), _logits(loaded[1].model, vocab)))
