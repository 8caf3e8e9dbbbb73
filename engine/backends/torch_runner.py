"""torch's runtime: a transformers model plus its KV cache (``ModelRunner``), and the model as a ``Backend``
(``TorchBackend``): the runner contract of engine/backends/contract.py.

``rollback`` is the one call that drops cached tokens (``DynamicCache.crop``); ``forward`` feeds new tokens and keeps
the logits on the model's device (sampling and verification run there; only chosen ids and shown p/q reach the host).
``TorchBackend.runner`` makes a new runner, with an empty cache, per call.
"""
from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import ClassVar

import torch
from transformers import DynamicCache

from engine.backends.contract import PrefixReuse


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device``: a clock read after it measures that work. GPU kernels run
    asynchronously, and since the logits stay on the device nothing else waits for them (CPU: a no-op)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass(frozen=True)
class TorchBackend:
    """A transformers model run by torch. Equal for the same model: a model loaded for two roles counts once."""
    model: torch.nn.Module
    kind: ClassVar[str] = "torch"

    def runner(self, vocab_size: int, context_ids: list[int] | None = None) -> ModelRunner:
        """A new runner with an empty KV cache (nothing is kept to pick from: ``context_ids`` changes nothing)."""
        return ModelRunner(self.model, vocab_size)

    def describe(self) -> str:
        return f"{self.kind} {torch.__version__}, {getattr(self.model.config, '_attn_implementation', '?')} attention"

    def weight_bytes(self) -> int:
        """Bytes of the model's parameters and buffers."""
        tensors = itertools.chain(self.model.parameters(), self.model.buffers())
        return sum(t.numel() * t.element_size() for t in tensors)

    @contextmanager
    def forward_clock(self, total: list[float]) -> Iterator[list[float]]:
        """From each forward's call to its return (forward hooks): the model's, or its decoder's where a trimmed
        head skips the model's own forward (the kept rows' matmul then counts as outside)."""
        depth, started = [0], [0.0]

        def enter(module, args) -> None:
            started[0] = time.perf_counter() if depth[0] == 0 else started[0]
            depth[0] += 1

        def leave(module, args, out) -> None:
            depth[0] -= 1
            total[0] += time.perf_counter() - started[0] if depth[0] == 0 else 0.0
        modules = {id(m): m for m in (self.model, self.model.get_decoder())}.values()
        handles = [hook for m in modules for hook in (m.register_forward_pre_hook(enter),
                                                      m.register_forward_hook(leave))]
        try:
            yield total
        finally:
            for handle in handles:
                handle.remove()


class ModelRunner(PrefixReuse):
    """A transformers model and its ``DynamicCache``: the ``Runner`` contract (engine/backends/contract.py)."""

    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # logits are cut to the tokenizer's vocabulary (padding rows dropped)
        self.device = next(model.parameters()).device
        self.logits_device = str(self.device)
        self.tokens: list[int] = []
        self.row_widths: list[int] = []
        self.cache = DynamicCache(config=model.config)
        self.head_ids: torch.Tensor | None = None  # with a trimmed head, only these tokens get logits
        self._head = None  # the trimmed head: hidden (n, hidden) -> logits of head_ids (n, kept)

    def trim_head(self, token_ids: list[int] | None) -> None:
        """Compute logits only for ``token_ids`` (others get -inf); None restores the full output head."""
        head = self.model.get_output_embeddings()
        plain = isinstance(getattr(head, "weight", None), torch.Tensor)
        if token_ids is None or not (plain or hasattr(head, "rows")):  # rows(): engine/models/int8_weight.py
            self.head_ids = self._head = None  # the full head (a head that cannot be cut, e.g. int8-dynamic)
            return
        self.head_ids = torch.tensor(sorted(set(token_ids)), device=self.device)
        if plain:
            weight = head.weight[self.head_ids]  # (kept, hidden)
            self._head = lambda hidden: hidden @ weight.T
        else:
            self._head = head.rows(self.head_ids)

    def synchronize(self) -> None:
        synchronize(self.device)

    def reset(self) -> None:
        self.tokens = []
        self.row_widths = []
        self.cache = DynamicCache(config=self.model.config)

    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` consumed tokens."""
        if n_tokens < len(self.tokens):
            self.cache.crop(n_tokens - len(self.tokens))  # transformers 5: a negative count removes tokens
            del self.tokens[n_tokens:]
            del self.row_widths[n_tokens:]

    @torch.inference_mode()
    def forward(self, new_ids: list[int], n_logits: int = 0) -> torch.Tensor:
        """Feed ``new_ids``; return float32 logits of the last ``n_logits`` positions (0 = all): (n, vocab), on the
        model's device (sampling and verification run there; only chosen ids and shown p/q reach the host)."""
        input_ids = torch.tensor([new_ids], device=self.device)
        if self.head_ids is not None:
            return self._forward_trimmed(input_ids, n_logits)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
        self.tokens.extend(new_ids)
        self.row_widths.extend([len(new_ids)] * len(new_ids))
        return out.logits[0, :, : self.vocab_size].float()

    def _forward_trimmed(self, input_ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        hidden = self.model.get_decoder()(input_ids=input_ids, cache=self.cache, use_cache=True).last_hidden_state
        self.tokens.extend(input_ids[0].tolist())
        self.row_widths.extend([input_ids.shape[1]] * input_ids.shape[1])
        hidden = hidden[0, -n_logits:] if n_logits else hidden[0]  # (n, hidden)
        logits = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        logits[:, self.head_ids] = self._head(hidden).float()  # (n, kept)
        return logits
