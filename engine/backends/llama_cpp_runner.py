"""A llama.cpp context with the ``ModelRunner`` contract: llama.cpp's integer kernels under our decode loop.

Same invariant as engine/backends/torch_runner.py: the KV cache holds exactly ``tokens``, and ``rollback`` is the one
call that drops cached tokens (``llama_memory_seq_rm``). ``forward`` fills one ``llama_batch`` (a logits flag
only on the rows asked for), runs ``llama_decode`` and copies those rows out of llama.cpp's buffer into one
tensor: the only copy a step makes. Prompts longer than a batch are fed in ``n_batch`` chunks (llama.cpp's
batched prefill). llama-cpp-python's low-level API (ctypes) is imported by the caller (engine/backends/llama_cpp.py).
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from engine.backends.torch_runner import PrefixReuse


class LlamaCppRunner(PrefixReuse):
    """One llama.cpp context (its own KV cache) of a loaded GGUF model. ``lib`` is the ``llama_cpp`` module."""
    device = torch.device("cpu")
    head_ids = None  # llama.cpp computes the whole output head: trim_head is a no-op

    def __init__(self, lib, ctx, batch, n_batch: int, n_vocab: int, vocab_size: int, tokens: list[int] | None = None):
        self.lib, self.ctx, self.batch, self.n_batch = lib, ctx, batch, n_batch
        self.n_vocab, self.vocab_size = n_vocab, vocab_size  # the model's output rows, the tokenizer's vocabulary
        self.memory = lib.llama_get_memory(ctx)
        self.tokens: list[int] = tokens if tokens is not None else []  # what this context's KV cache holds

    def trim_head(self, token_ids: list[int] | None) -> None:
        """Not supported by llama.cpp's graph: the full head is computed (as for a head that cannot be cut)."""

    def reset(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)
        self.tokens.clear()  # in place: the context's pool keeps this list (engine/backends/llama_cpp.py)

    def cache_len(self) -> int:
        """The positions llama.cpp's KV cache holds (its own count, not ours: the invariant tests compare)."""
        return self.lib.llama_memory_seq_pos_max(self.memory, 0) + 1

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` consumed tokens."""
        if n_tokens < len(self.tokens):
            if not self.lib.llama_memory_seq_rm(self.memory, 0, n_tokens, -1):
                raise RuntimeError(f"llama.cpp could not roll its KV cache back to {n_tokens} tokens")
            del self.tokens[n_tokens:]

    def forward(self, new_ids: list[int], n_logits: int = 0) -> torch.Tensor:
        """Feed ``new_ids``; float32 logits of the last ``n_logits`` positions (0 = all): (n, vocab)."""
        n = len(new_ids)
        n_logits = n if n_logits <= 0 else min(n_logits, n)
        last = n - (max(n - 1, 0) // self.n_batch) * self.n_batch  # rows in the last chunk: only its logits remain
        if n_logits > last:
            raise ValueError(f"logits of {n_logits} rows asked from a forward whose last chunk has {last}")
        for start in range(0, n, self.n_batch):
            self._decode(new_ids[start:start + self.n_batch], first_out=n - n_logits - start)
        rows = ctypes.cast(self.lib.llama_get_logits(self.ctx), ctypes.POINTER(ctypes.c_float))
        out = np.ctypeslib.as_array(rows, shape=(n_logits, self.n_vocab))  # llama.cpp's buffer: the outputs in order
        return torch.from_numpy(out[:, : self.vocab_size].copy())

    def _decode(self, chunk: list[int], first_out: int) -> None:
        batch, pos = self.batch, len(self.tokens)
        batch.n_tokens = len(chunk)
        for i, token in enumerate(chunk):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first_out
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status}) feeding {len(chunk)} tokens at position {pos}"
                               + (": the context is full" if status == 1 else ""))
        self.tokens.extend(chunk)
