"""``int8-weight``: int8 weights (one scale per output row), bf16 activations, torch's CPU kernel
``torch._weight_int8pack_mm``.

Why not torch's dynamic int8 (``int8-dynamic``) for a target: it quantises the activations with one scale
for the whole input, so a token's logits depend on the other tokens fed in the same forward; verifying k+1
tokens then gives other logits than feeding them one by one, and the loop is no longer lossless. Here each
row of the output depends on its own input row only (exact int8 weights; checked in tests), and the weights
take half the memory traffic of bf16.
"""
from __future__ import annotations

import torch


class Int8WeightLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        weight = linear.weight.detach().float()  # (out, in)
        scales = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # (out,)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("int8_weight", torch.round(weight / scales[:, None]).to(torch.int8).contiguous())
        self.register_buffer("scales", scales.to(torch.bfloat16))
        bias = None if linear.bias is None else linear.bias.detach().to(torch.bfloat16)
        self.register_buffer("bias", bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.int8_weight, self.scales)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)


    def rows(self, ids: torch.Tensor) -> Int8WeightLinear:
        """The layer of only the output rows ``ids`` (a trimmed output head): the same numbers for those rows."""
        part = Int8WeightLinear.__new__(Int8WeightLinear)
        torch.nn.Module.__init__(part)
        part.in_features, part.out_features = self.in_features, len(ids)
        part.register_buffer("int8_weight", self.int8_weight[ids].contiguous())
        part.register_buffer("scales", self.scales[ids].contiguous())
        part.register_buffer("bias", None if self.bias is None else self.bias[ids])
        return part


def quantize_int8_weight(model: torch.nn.Module) -> torch.nn.Module:
    """Replace every nn.Linear of a bf16 model by an Int8WeightLinear, in place (tied heads get their own copy)."""
    for name, child in list(model.named_children()):
        if isinstance(child, torch.nn.Linear):
            setattr(model, name, Int8WeightLinear(child))
        else:
            quantize_int8_weight(child)
    return model
