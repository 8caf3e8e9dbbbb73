"""Pure sampling math: logits -> probabilities -> token. Shared by the reference decoder, proposers and verify."""
from __future__ import annotations

import torch

from engine.config import SamplingConfig


def logits_to_probs(logits: torch.Tensor, sampling: SamplingConfig) -> torch.Tensor:
    """(..., vocab) logits -> (..., vocab) float32 probabilities after temperature, top-k and top-p.

    Greedy (temperature 0) returns the plain softmax: the choice is its argmax, and the probabilities are
    still meaningful to show (p_target, q_draft).
    """
    logits = logits.float()
    if sampling.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / sampling.temperature
    if sampling.top_k and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1.0:
        probs = _top_p_filter(probs, sampling.top_p)
    return probs


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, renormalised."""
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def sample(probs: torch.Tensor, sampling: SamplingConfig, generator: torch.Generator | None) -> int:
    """One token from a (vocab,) distribution: argmax when greedy, else a draw with ``generator``."""
    if sampling.greedy:
        return int(torch.argmax(probs))
    return int(torch.multinomial(probs, 1, generator=generator))


def top_tokens(probs: torch.Tensor, n: int) -> list[list[tuple[int, float]]]:
    """(rows, vocab) probabilities -> each row's ``n`` most likely (token id, probability), most likely first. Tokens
    of probability 0 (removed by top-k or top-p) are left out. n == 0 computes nothing: empty rows."""
    if n == 0:
        return [[] for _ in range(probs.shape[0])]
    values, ids = torch.topk(probs, min(n, probs.shape[-1]), dim=-1)  # (rows, n) each
    return [[(i, p) for i, p in zip(row_ids, row_p) if p > 0] for row_ids, row_p in zip(ids.tolist(), values.tolist())]


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on the device the probabilities live on (the same seed draws differently on each device)."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed if seed is not None else torch.seed())
    return generator
