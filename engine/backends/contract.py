"""The runner contract: what the decoders, the step clock, the load-time checks and the proposers may ask of a
model and its KV cache, whichever runtime runs it (torch: engine/backends/torch_runner.py; llama.cpp:
engine/backends/llama_cpp.py and engine/backends/llama_cpp_runner.py). Nothing above this layer asks which one.

Invariant (checked on every backend, tests/backends/test_runner_contract.py): ``cache_len() == len(tokens)``, the
cache holds exactly the tokens the runner has consumed. ``forward`` is the one call that feeds tokens, ``rollback``
the one that drops them (``reset`` drops all). Positions follow from the cache length: callers track it (the loop's
``pos``, gpt-fast's ``input_pos``) and never rescan their context per step.

A runner may hold tokens when it is handed out (a pooled context keeps what its last user left): a decoder calls
``resume`` once per request, which keeps what is still valid for its context; a caller that needs an empty cache
calls ``reset``. Each held token's row remembers how wide the forward that computed it was (``row_widths``): on
kernels whose rows differ between narrow and wide forwards (llama.cpp's tiled K-quant matmul from 8 rows, measured
by the load-time identity check), a decode that must be the target's own keeps only rows a fresh prefill of its
prompt would have computed the same way (``resume``'s ``narrow``). Logits are a float32 torch tensor ``(n, vocab)`` on the device ``logits_device`` names; torch is
imported here only for the type.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists (= index of the first difference)."""
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


class Runner(Protocol):
    """A model with its KV cache. ``tokens``: what the cache holds, in order; ``vocab_size``: the columns of the
    logits (the tokenizer's vocabulary); ``logits_device``: where ``forward``'s logits live, as torch names a device
    (``"cpu"``, ``"cuda:0"``): the decoders make their sampling generator there."""
    tokens: list[int]
    row_widths: list[int]  # for each held token, how many tokens the forward that computed its row took
    vocab_size: int
    logits_device: str

    def forward(self, new_ids: list[int], n_logits: int = 0) -> torch.Tensor:
        """Feed ``new_ids`` after ``tokens``; float32 logits of the last ``n_logits`` positions (0 = all): (n, vocab)."""
        ...

    def rollback(self, n_tokens: int) -> None:
        """Keep only the first ``n_tokens`` consumed tokens."""
        ...

    def reset(self) -> None:
        """Drop every consumed token."""
        ...

    def cache_len(self) -> int:
        """The positions the KV cache holds, by the runtime's own count (the invariant tests compare it with
        ``tokens``)."""
        ...

    def reusable_prefix(self, context_ids: list[int], narrow: int | None = None) -> int:
        """How many consumed tokens are still valid for ``context_ids``; changes nothing (``narrow``: see resume)."""
        ...

    def resume(self, context_ids: list[int], narrow: int | None = None) -> int:
        """Keep what is still valid for ``context_ids``, drop the rest; how many tokens the runner holds. With
        ``narrow`` (the widest forward whose rows equal rows fed alone), only what leaves every row as a fresh
        prefill of ``context_ids`` computes it."""
        ...

    def trim_head(self, token_ids: list[int] | None) -> None:
        """Compute logits only for ``token_ids`` (others get -inf) where the runtime can; None restores the full
        head. A runtime that cannot keeps the full head, so callers must be right either way: a draft then
        drafts from the whole vocabulary, and the judge reads only the kept tokens' logits."""
        ...

    def synchronize(self) -> None:
        """Wait for the work ``forward`` queued, so a clock read after it measures that work (a GPU runs kernels
        asynchronously; a runtime whose forward returns finished waits for nothing)."""
        ...


class Backend(Protocol):
    """What runs a loaded model: ``LoadedModel.backend``, provided by each runtime module. ``kind`` names the
    runtime (``"torch"``, ``"llama.cpp"``)."""
    kind: str

    def runner(self, vocab_size: int, context_ids: list[int] | None = None) -> Runner:
        """A runner on this model whose logits have ``vocab_size`` columns; it may hold tokens (see the module
        docstring). ``context_ids``: the prompt it is for, where a runtime keeps several contexts and can pick the
        one holding most of it (None: a runner that will empty its cache)."""
        ...

    def describe(self) -> str:
        """What runs the model, in words: the runtime and the settings that change its numbers."""
        ...

    def weight_bytes(self) -> int:
        """Bytes of the model's weights in memory."""
        ...

    def forward_clock(self, total: list[float]) -> AbstractContextManager[list[float]]:
        """While open, adds the seconds spent inside this model's forward computation to ``total[0]`` (the bench
        of the time outside the forwards, bench/speed/overhead.py)."""
        ...


def canonical_prefix(row_widths: list[int], keep: int, context_len: int, narrow: int) -> int:
    """How much of ``keep`` held rows a decode may reuse so that every row of its ``context_len``-token prompt is
    computed as one forward of the whole prompt computes it (the target-only reference from an empty cache).

    Where rows fed in forwards of up to ``narrow`` tokens equal rows fed alone and wider forwards round otherwise
    (llama.cpp's tiled K-quant matmul from 8 rows), a row is of one of two kinds, and a wide row is the same in any
    wide forward (measured: tests/backends/test_canonical_prefill.py). A fresh prefill makes every prompt row wide
    when the prompt is wider than ``narrow``, else narrow; so only a held prefix of that kind is kept, and where the
    rows are wide, at least ``narrow + 1`` tokens are left to feed so that they are wide too."""
    wide = context_len > narrow
    keep = next((i for i, width in enumerate(row_widths[:keep]) if (width > narrow) != wide), keep)
    return max(0, min(keep, context_len - narrow - 1)) if wide else keep


class PrefixReuse:
    """The one reuse rule of every runner: ``reusable_prefix`` and ``resume`` from ``tokens``, ``row_widths`` and
    ``rollback``."""

    def reusable_prefix(self, context_ids: list[int], narrow: int | None = None) -> int:
        """How many consumed tokens are still valid for ``context_ids``. Changes nothing. O(context): once per
        request (a reused runner), not per step.

        Never the whole context: the last context token must be fed again, its logits predict what comes next.
        With ``narrow``, only rows a fresh prefill would compute the same (:func:`canonical_prefix`).
        """
        keep = common_prefix(self.tokens, context_ids[:-1])
        return keep if narrow is None else canonical_prefix(self.row_widths, keep, len(context_ids), narrow)

    def resume(self, context_ids: list[int], narrow: int | None = None) -> int:
        """The one reuse rule of every decoder and draft: keep what this runner still holds of ``context_ids``
        (a runner from an earlier generation may hold a shorter, longer or different context), drop the rest,
        and return how many tokens it holds: the decode feeds ``context_ids`` from there. Once per request.
        ``narrow``: the widest forward whose rows equal rows fed alone, where a decode must be the target's own
        (:func:`canonical_prefix`); None keeps every valid row."""
        pos = self.reusable_prefix(context_ids, narrow)
        self.rollback(pos)
        return pos
