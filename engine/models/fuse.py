"""Fewer, wider matmuls per decoder layer: q/k/v as one layer, gate/up as one layer.

A small model's CPU forward is many small matmul calls, and each costs its dispatch on top of the bytes it reads;
fusing the projections that read the same input makes 4 calls a layer of 7.
Fusing concatenates weight rows, and every output row of these kernels is computed from its own weight row
alone, so the results are bit-for-bit those of the separate layers (tests/models/test_fuse.py).

Layers are fused before they are built (the packed int4 layout cannot be concatenated afterwards): a *part*
is the recipe of one projection, ``("int4", (q, scale, offset), bias)`` or ``("int8", nn.Linear)``, and parts of
one kind concatenate by rows.
"""
from __future__ import annotations

import torch

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")


def concat_parts(parts: list[tuple]) -> tuple:
    """One part whose rows are the rows of ``parts`` in order (all of one kind)."""
    kind = parts[0][0]
    if kind == "int4":
        grid = tuple(torch.cat([p[1][i] for p in parts]) for i in range(3))
        biases = [p[2] for p in parts]
        bias = None if all(b is None for b in biases) else torch.cat(
            [b.detach() if b is not None else torch.zeros(p[1][0].shape[0]) for b, p in zip(biases, parts)])
        return ("int4", grid, bias)
    linears = [p[1] for p in parts]
    fused = torch.nn.Linear(linears[0].in_features, sum(m.out_features for m in linears),
                            bias=any(m.bias is not None for m in linears), dtype=linears[0].weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([m.weight for m in linears]))
        if fused.bias is not None:
            fused.bias.copy_(torch.cat([m.bias if m.bias is not None else torch.zeros(m.out_features)
                                        for m in linears]))
    return ("int8", fused)


class FusedMLP(torch.nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up as one matmul (transformers' LlamaMLP/Qwen2MLP)."""

    def __init__(self, gate_up: torch.nn.Module, down_proj: torch.nn.Module, act_fn, intermediate: int):
        super().__init__()
        self.gate_up, self.down_proj, self.act_fn, self.intermediate = gate_up, down_proj, act_fn, intermediate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.intermediate, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class FusedQKV(torch.nn.Module):
    """q, k and v of one input from one matmul; the attention module calls ``q_proj``, ``k_proj`` and ``v_proj``
    (the :class:`QKVSlice` views) with the same tensor in turn, and the first call computes all three."""

    def __init__(self, qkv: torch.nn.Module, sizes: tuple[int, int, int]):
        super().__init__()
        self.qkv, self.sizes = qkv, sizes
        self._input: torch.Tensor | None = None
        self._parts: tuple[torch.Tensor, ...] = ()

    def part(self, x: torch.Tensor, index: int) -> torch.Tensor:
        if x is not self._input:  # a new input (the first of the three calls)
            self._input, self._parts = x, self.qkv(x).split(self.sizes, dim=-1)
        out = self._parts[index]
        if index == len(self.sizes) - 1:  # the last view taken: hold no activations between forwards
            self._input, self._parts = None, ()
        return out


class QKVSlice(torch.nn.Module):
    def __init__(self, fused: FusedQKV, index: int):
        super().__init__()
        self.index = index
        self.__dict__["fused"] = fused  # not a submodule: the attention module owns it once, as ``qkv``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fused.part(x, self.index)
