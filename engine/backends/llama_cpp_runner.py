"""A llama.cpp context as a ``Runner`` (engine/backends/contract.py): llama.cpp's integer kernels under our decode loop.

The KV cache holds exactly ``tokens``, and ``rollback`` is the one call that drops cached tokens
(``llama_memory_seq_rm``). ``forward`` fills one ``llama_batch`` (a logits flag only on the rows asked for), runs one
``llama_decode`` and copies those rows out of llama.cpp's buffer into one tensor: the only copy a step makes, and the
only use of torch here. A context's batch holds the whole context, so any forward that fits the context is one
decode. llama-cpp-python's low-level API (ctypes) is the model's (engine/backends/llama_cpp.py).
"""
from __future__ import annotations

import ctypes

import numpy as np
import torch

from engine.backends.contract import PrefixReuse


class LlamaCppRunner(PrefixReuse):
    """One llama.cpp context (its own KV cache) of ``model``, a loaded GGUF file (engine/backends/llama_cpp.py's
    GgufModel, which made it), kept alive by the runner: the model frees its contexts with itself. The logits are
    host memory (``logits_device`` ``"cpu"``), finished when ``forward`` returns."""
    logits_device = "cpu"

    def __init__(self, model, ctx, batch, vocab_size: int, tokens: list[int] | None = None,
                 row_widths: list[int] | None = None):
        self.model, self.lib, self.ctx, self.batch = model, model.lib, ctx, batch
        self.n_ctx, self.n_vocab = model.n_ctx, model.n_vocab  # positions a context holds, the model's output rows
        self.vocab_size = vocab_size  # the tokenizer's vocabulary: the logits' columns
        self.memory = self.lib.llama_get_memory(ctx)
        self.tokens: list[int] = tokens if tokens is not None else []  # what this context's KV cache holds
        self.row_widths: list[int] = row_widths if row_widths is not None else [0] * len(self.tokens)

    def trim_head(self, token_ids: list[int] | None) -> None:
        """Not supported by llama.cpp's graph: the full head is computed (as for a head that cannot be cut)."""

    def synchronize(self) -> None:
        """Nothing to wait for: ``llama_decode`` returns when the forward is done."""

    def reset(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)
        self.tokens.clear()  # in place: the context's pool keeps these lists (engine/backends/llama_cpp.py)
        self.row_widths.clear()

    def cache_len(self) -> int:
        """The positions llama.cpp's KV cache holds (its own count, not ours: the invariant tests compare)."""
        return self.lib.llama_memory_seq_pos_max(self.memory, 0) + 1

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` consumed tokens."""
        if n_tokens < len(self.tokens):
            if not self.lib.llama_memory_seq_rm(self.memory, 0, n_tokens, -1):
                raise RuntimeError(f"llama.cpp could not roll its KV cache back to {n_tokens} tokens")
            del self.tokens[n_tokens:]
            del self.row_widths[n_tokens:]

    def forward(self, new_ids: list[int], n_logits: int = 0) -> torch.Tensor:
        """Feed ``new_ids``; float32 logits of the last ``n_logits`` positions (0 = all): (n, vocab)."""
        n, pos = len(new_ids), len(self.tokens)
        if pos + n > self.n_ctx:
            raise ValueError(f"a forward of {n} tokens after {pos} does not fit the {self.n_ctx}-token context")
        n_logits = n if n_logits <= 0 else min(n_logits, n)
        batch = self.batch
        batch.n_tokens = n
        for i, token in enumerate(new_ids):
            batch.token[i] = token
            batch.pos[i] = pos + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= n - n_logits
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed ({status}) feeding {n} tokens at position {pos}"
                               + (": the context is full" if status == 1 else ""))
        self.tokens.extend(new_ids)
        self.row_widths.extend([n] * n)
        rows = ctypes.cast(self.lib.llama_get_logits(self.ctx), ctypes.POINTER(ctypes.c_float))
        out = np.ctypeslib.as_array(rows, shape=(n_logits, self.n_vocab))  # llama.cpp's buffer: the outputs in order
        return torch.from_numpy(out[:, : self.vocab_size].copy())
