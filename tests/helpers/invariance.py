"""Batch invariance: the logits of a token fed inside a k-token verify against the same token fed alone."""
from __future__ import annotations

import torch

from engine.backends.torch_runner import ModelRunner


def _ids(n: int, vocab: int) -> list[int]:
    return [(31 * i + 7) % (vocab - 2) + 1 for i in range(n)]


def verify_vs_alone(model, vocab: int, context: int, max_k: int = 16) -> dict[int, torch.Tensor]:
    """Per k in 1..max_k, the largest |difference| between each row of one k-token forward and the same
    positions fed one token at a time, after the same ``context`` (prefilled once, identically)."""
    ids = _ids(context + max_k, vocab)
    runner = ModelRunner(model, vocab)
    runner.forward(ids[:context], n_logits=1)
    alone = torch.cat([runner.forward([token], n_logits=1) for token in ids[context:]])  # (max_k, vocab)
    gaps = {}
    for k in range(1, max_k + 1):
        runner.rollback(context)
        batched = runner.forward(ids[context:context + k], n_logits=k)  # (k, vocab)
        gaps[k] = (batched - alone[:k]).abs().amax(dim=-1)  # (k,)
    return gaps


def steps_off(model, vocab: int, context: int, precision: str, max_k: int = 16) -> float:
    """The largest verify-vs-alone difference in rounding steps of each row's top logit
    (engine.precision.rounding_step)."""
    from engine.precision import rounding_step

    ids = _ids(context + max_k, vocab)
    runner = ModelRunner(model, vocab)
    runner.forward(ids[:context], n_logits=1)
    alone = torch.cat([runner.forward([token], n_logits=1) for token in ids[context:]])  # (max_k, vocab)
    worst = 0.0
    for k in range(1, max_k + 1):
        runner.rollback(context)
        batched = runner.forward(ids[context:context + k], n_logits=k)  # (k, vocab)
        for row, (b, a) in enumerate(zip(batched, alone[:k])):
            step = rounding_step(precision, float(a.max()))
            worst = max(worst, float((b - a).abs().max()) / step)
    return worst
