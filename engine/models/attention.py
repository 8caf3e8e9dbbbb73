"""Row-exact attention for the CPU: each query row of a short forward is computed exactly as that token fed alone.

Eager attention multiplies the whole (n, L) block of attention weights by V in one batched bf16 GEMM. The
masked columns are zeros, so the sums are the same numbers, but the GEMM blocks its inner dimension by L: a
row of a 4-token verify (L = 12) is summed in another order than the same token fed alone (L = 11), and the
logits can differ by a bf16 step (q, k and v stay equal, ``softmax(QK^T) @ V`` does not; how it was found:
docs/models.md, "bit-for-bit identity").

Here a forward of at most ``ROW_EXACT_MAX`` tokens (a decode step, a verify, a short prompt) runs each query
row over exactly the keys it may see, as a forward of that one token does: the same shapes, so the same
kernels and the same sums. Longer forwards (a prompt's prefill: both decoders run the same one, never with a
draft in it: engine/decode/step.py) and anything this does not cover (a padded batch, a sliding window that cuts)
are eager attention's. The cost is n small matmul pairs per layer instead of one, small beside the layer's weight
matmuls (measured in docs/models.md).
"""
from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask
from transformers.models.llama.modeling_llama import eager_attention_forward, repeat_kv

ROW_EXACT = "speclens-row-exact"
ROW_EXACT_MAX = 64  # the widest forward computed row by row: every verify (k <= 32 free tokens) and decode step


def row_exact_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                        attention_mask: torch.Tensor | None, scaling: float, dropout: float = 0.0, **kwargs):
    """``eager_attention_forward``'s contract (query (b, h, n, d), key/value (b, h_kv, L, d) with the cache);
    rows computed alone when the forward is short, causal and unpadded, eager otherwise."""
    n, length = query.shape[2], key.shape[2]
    window = kwargs.get("sliding_window")
    if query.shape[0] != 1 or n > ROW_EXACT_MAX or module.training or (window is not None and length > window):
        return eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout, **kwargs)
    keys = repeat_kv(key, module.num_key_value_groups)
    values = repeat_kv(value, module.num_key_value_groups)
    rows = []
    for i in range(n):
        seen = length - n + i + 1  # causal: row i sees the cache and the rows before it, as it would alone
        weights = torch.matmul(query[:, :, i:i + 1], keys[:, :, :seen].transpose(2, 3)) * scaling
        weights = torch.nn.functional.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
        rows.append(torch.matmul(weights, values[:, :, :seen]))  # (b, h, 1, d)
    return torch.cat(rows, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(ROW_EXACT, row_exact_attention)
AttentionMaskInterface.register(ROW_EXACT, eager_mask)  # the mask eager would get (used where it falls back)
