"""A model plus its KV cache, with the one place where cache state changes.

Invariant (checked in tests): ``cache length == len(tokens)``, i.e. the cache holds exactly the tokens this
model has consumed. ``rollback`` is the one call that drops cached tokens; ``forward`` feeds new tokens.
Positions follow from the cache length: callers track it (the loop's ``pos``, gpt-fast's ``input_pos``) and
never rescan their context per step; ``resume`` is for a runner reused across requests, once each.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on ``device``: a clock read after it measures that work. GPU kernels run
    asynchronously, and since the logits stay on the device nothing else waits for them (CPU: a no-op)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (= index of the first difference)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class PrefixReuse:
    """The one reuse rule of every runner kind (torch's, llama.cpp's): needs ``tokens`` and ``rollback``."""

    def reusable_prefix(self, context_ids: list[int]) -> int:
        """How many consumed tokens are still valid for ``context_ids``. Changes nothing. O(context): once per
        request (a reused runner), not per step.

        Never the whole context: the last context token must be fed again, its logits predict what comes next.
        """
        return common_prefix(self.tokens, context_ids[:-1])

    def resume(self, context_ids: list[int]) -> int:
        """The one reuse rule of every decoder and draft: keep what this runner still holds of ``context_ids``
        (a runner from an earlier generation may hold a shorter, longer or different context), drop the rest,
        and return how many tokens it holds: the decode feeds ``context_ids`` from there. Once per request."""
        pos = self.reusable_prefix(context_ids)
        self.rollback(pos)
        return pos


class ModelRunner(PrefixReuse):
    def __init__(self, model, vocab_size: int):
        self.model = model
        self.vocab_size = vocab_size  # logits are cut to the tokenizer's vocabulary (padding rows dropped)
        self.device = next(model.parameters()).device
        self.tokens: list[int] = []
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

    def reset(self) -> None:
        self.tokens = []
        self.cache = DynamicCache(config=self.model.config)

    def cache_len(self) -> int:
        return self.cache.get_seq_length()

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` consumed tokens."""
        if n_tokens < len(self.tokens):
            self.cache.crop(n_tokens - len(self.tokens))  # transformers 5: a negative count removes tokens
            del self.tokens[n_tokens:]

    @torch.inference_mode()
    def forward(self, new_ids: list[int], n_logits: int = 0) -> torch.Tensor:
        """Feed ``new_ids``; return float32 logits of the last ``n_logits`` positions (0 = all): (n, vocab), on the
        model's device (sampling and verification run there; only chosen ids and shown p/q reach the host)."""
        input_ids = torch.tensor([new_ids], device=self.device)
        if self.head_ids is not None:
            return self._forward_trimmed(input_ids, n_logits)
        out = self.model(input_ids=input_ids, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
        self.tokens.extend(new_ids)
        return out.logits[0, :, : self.vocab_size].float()

    def _forward_trimmed(self, input_ids: torch.Tensor, n_logits: int) -> torch.Tensor:
        hidden = self.model.get_decoder()(input_ids=input_ids, cache=self.cache, use_cache=True).last_hidden_state
        self.tokens.extend(input_ids[0].tolist())
        hidden = hidden[0, -n_logits:] if n_logits else hidden[0]  # (n, hidden)
        logits = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        logits[:, self.head_ids] = self._head(hidden).float()  # (n, kept)
        return logits
