"""``int4``: 4-bit weights in affine groups of 32, bf16 activations, torch's CPU kernel
``torch._weight_int4pack_mm_for_cpu``.

The kernel computes each group as ``w = (q - 8) * scale + zero`` with ``q`` in 0..15. That is exactly the form
of llama.cpp's 4-bit formats, so a model that comes from a GGUF keeps the file's own grid:
- Q4_K: a sub-block of 32 weights is ``d*sc*q - dmin*m``: ``scale = d*sc``, ``zero = 8*scale - dmin*m``;
- Q4_1: a block of 32 is ``d*q + m``: ``scale = d``, ``zero = 8*d + m``.
The layer then holds the weights llama.cpp runs, up to the bf16 rounding of each scale and zero. Tensors the
file keeps at higher precision (Q6_K, Q8_0, Q5_0, ...) and models without a GGUF are handled by the caller
(engine/models/loading.py): int8-weight rows, or group-wise 4-bit from the bf16 weights (:func:`affine_groups`).

Each output row depends on its own input row only (no activation scale shared across tokens), so a token's
logits do not depend on the other tokens of a verify forward (checked in tests/models/test_int4.py).
"""
from __future__ import annotations

import numpy as np
import torch

GROUP = 32  # weights per affine group (a Q4_K sub-block, a Q4_1 block)
_ZERO_POINT = 8  # the kernel's q - 8


class Int4WeightLinear(torch.nn.Module):
    """A Linear whose weight is ``scale * q - offset`` per group of 32 inputs; ``q`` (out, in) in 0..15."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = q.shape
        zero = _ZERO_POINT * scale - offset  # (out, in / GROUP): the kernel's (q - 8) * scale + zero
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(q.to(torch.int32).contiguous(), 1))
        # (in / GROUP, out, 2): what the kernel reads
        self.register_buffer("scales_and_zeros", torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16)
                             .contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().to(torch.bfloat16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        out = torch._weight_int4pack_mm_for_cpu(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.packed, GROUP,
                                                self.scales_and_zeros)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def dequantized(self) -> torch.Tensor:
        """The (out, in) fp32 weight the kernel multiplies by (tests and the quality report)."""
        eye = torch.eye(self.in_features, dtype=torch.bfloat16)
        return torch._weight_int4pack_mm_for_cpu(eye, self.packed, GROUP, self.scales_and_zeros).t().float()


def affine_groups(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise asymmetric 4-bit quantisation of a (out, in) weight: ``(q, scale, offset)`` with
    ``weight ~ scale * q - offset`` per group of 32 inputs (min/max grid: the group's min and max are on it)."""
    out_features, in_features = weight.shape
    groups = weight.detach().float().reshape(out_features, in_features // GROUP, GROUP)
    low, high = groups.amin(dim=-1), groups.amax(dim=-1)  # (out, in / GROUP)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15).to(torch.uint8)
    return q.reshape(out_features, in_features), scale, -low


def gguf_affine_groups(tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
    """The 4-bit grid of a GGUF tensor (a ``gguf.ReaderTensor``) as ``(q, scale, offset)``, or None when the
    tensor is not stored as Q4_K or Q4_1. Rows are the file's rows (out, in)."""
    from gguf import GGMLQuantizationType, quants

    blocks = np.asarray(tensor.data)
    rows = blocks.shape[0]
    if tensor.tensor_type == GGMLQuantizationType.Q4_K:
        blocks = blocks.reshape(-1, 144)  # per 256 weights: d, dmin (fp16), 12 bytes of 6-bit sc/m, 128 of q
        d = blocks[:, 0:2].view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].view(np.float16).astype(np.float32)
        sc, m = quants.Q4_K.get_scale_min(blocks[:, 4:16])
        scale, offset = d * sc.astype(np.float32), dmin * m.astype(np.float32)  # (blocks, 8)
        # 4 chunks of 32 bytes: low nibbles are sub-block 2i, high nibbles sub-block 2i + 1 (gguf's own order)
        qs = blocks[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        q = (qs & 0x0F).reshape(-1, 8, 32)
    elif tensor.tensor_type == GGMLQuantizationType.Q4_1:
        blocks = blocks.reshape(-1, 20)  # per 32 weights: d, m (fp16), 16 bytes of q (low nibbles first)
        scale = blocks[:, 0:2].view(np.float16).astype(np.float32)
        offset = -blocks[:, 2:4].view(np.float16).astype(np.float32)
        qs = blocks[:, 4:].reshape(-1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 2, 1)
        q = (qs & 0x0F).reshape(-1, 1, 32)
    else:
        return None
    return (torch.from_numpy(np.ascontiguousarray(q.reshape(rows, -1))),
            torch.from_numpy(np.ascontiguousarray(scale.reshape(rows, -1))),
            torch.from_numpy(np.ascontiguousarray(offset.reshape(rows, -1))))


def dequantize_groups(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """``scale * q - offset`` in fp32, in gguf's own order of operations (so a GGUF grid dequantises to the very
    values transformers converted)."""
    rows = q.shape[0]
    groups = q.reshape(rows, -1, GROUP).float()
    return (scale[..., None] * groups - offset[..., None]).reshape(rows, -1)


def quantize_int4(model: torch.nn.Module, gguf_path=None, requantize: bool = False, fuse: bool = True) -> dict[str, int]:
    """Replace the nn.Linear layers of a bf16 model in place; returns how many projections took each path.

    - ``gguf``: the layer's tensor is Q4_K or Q4_1 in ``gguf_path``: the file's own grid (checked to give the very
      bf16 weights the model was converted to; otherwise the layer is quantised group-wise and counted ``groups``);
    - ``int8``: the output head, and tensors the file keeps at higher precision (Q6_K, Q8_0, Q5_0, ...) unless
      ``requantize``: int8-weight rows (engine/models/int8_weight.py);
    - ``groups``: everything else, group-wise 4-bit from the bf16 weights (:func:`affine_groups`).
    With ``fuse``, q/k/v and gate/up of a decoder layer become one matmul each where their parts are of one
    kind (engine/models/fuse.py): the same numbers, fewer calls.
    """
    grids = _gguf_grids(model, gguf_path) if gguf_path is not None else {}
    counts = {"gguf": 0, "int8": 0, "groups": 0}
    head = model.get_output_embeddings()
    parts = {}
    for name, linear in [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]:
        grid = grids.get(name)
        if grid is not None and torch.equal(dequantize_groups(*grid).to(torch.bfloat16), linear.weight.detach()):
            parts[name], path = ("int4", grid, linear.bias), "gguf"
        elif linear is head or (gguf_path is not None and name not in grids and not requantize) \
                or linear.in_features % GROUP:
            parts[name], path = ("int8", linear), "int8"
        else:
            parts[name], path = ("int4", affine_groups(linear.weight), linear.bias), "groups"
        counts[path] += 1
    if fuse:
        _fuse_layers(model, parts)
    for name, part in parts.items():
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, build(part))
    return counts


def build(part: tuple) -> torch.nn.Module:
    """The layer of a part (engine/models/fuse.py): an Int4WeightLinear or an Int8WeightLinear."""
    from engine.models.int8_weight import Int8WeightLinear

    return Int4WeightLinear(*part[1], part[2]) if part[0] == "int4" else Int8WeightLinear(part[1])


def _fuse_layers(model: torch.nn.Module, parts: dict[str, tuple]) -> None:
    """Swap in FusedQKV / FusedMLP where a layer's projections are parts of one kind; their parts leave ``parts``."""
    from engine.models.fuse import GATE_UP, QKV, FusedMLP, FusedQKV, QKVSlice, concat_parts

    for name, module in list(model.named_modules()):
        if all(f"{name}.{p}" in parts for p in QKV):
            group = [parts[f"{name}.{p}"] for p in QKV]
            if len({g[0] for g in group}) == 1:
                sizes = tuple(getattr(module, p).out_features for p in QKV)
                fused = FusedQKV(build(concat_parts(group)), sizes)
                module.qkv = fused
                for index, proj in enumerate(QKV):
                    setattr(module, proj, QKVSlice(fused, index))
                    del parts[f"{name}.{proj}"]
        if all(f"{name}.{p}" in parts for p in GATE_UP) and hasattr(module, "act_fn"):
            group = [parts[f"{name}.{p}"] for p in GATE_UP]
            if len({g[0] for g in group}) == 1:
                parent, _, attr = name.rpartition(".")
                down = parts.pop(f"{name}.down_proj")
                setattr(model.get_submodule(parent), attr, FusedMLP(build(concat_parts(group)), build(down),
                                                                    module.act_fn, module.gate_proj.out_features))
                for proj in GATE_UP:
                    del parts[f"{name}.{proj}"]


def _gguf_grids(model: torch.nn.Module, gguf_path) -> dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """HF module name -> the 4-bit grid of its GGUF tensor, rows in the model's order (llama's q/k rows are
    permuted in the file: transformers un-permutes them while converting, and so does this)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    arch = str(reader.fields["general.architecture"].contents())
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, model.config.num_hidden_layers)
    by_name = {t.name: t for t in reader.tensors}
    grids = {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        tensor = by_name.get(f"{names.get_name(name)}.weight")
        grid = None if tensor is None else gguf_affine_groups(tensor)
        if grid is None:
            continue
        if arch == "llama" and name.endswith(("q_proj", "k_proj")):
            heads = model.config.num_attention_heads if name.endswith("q_proj") else model.config.num_key_value_heads
            grid = tuple(_unpermute_rows(part, heads) for part in grid)
        grids[name] = grid
    return grids


def _unpermute_rows(rows: torch.Tensor, heads: int) -> torch.Tensor:
    """transformers' reverse of llama.cpp's q/k row permutation (rope pairs interleaved per head)."""
    half = rows.shape[0] // heads // 2
    return rows.reshape(heads, half, 2, *rows.shape[1:]).transpose(1, 2).reshape(rows.shape).contiguous()
