"""Do sampled tokens still follow the target's distribution? A randomized probability integral transform.

For each sampled token x at a position with target distribution p (after temperature, top-k, top-p), order the
vocabulary by decreasing p and take u = P(tokens ranked above x) + V * p(x), V ~ Uniform(0, 1). If x was drawn
from p, u is Uniform(0, 1), and the u of successive positions are independent (each conditioned on the prefix),
so the u of a whole cell can be pooled and tested with one chi-square over equal bins.

Why this check: speculative sampling is lossless only if rejection sampling is right; a bug that accepts the
draft too often (or samples the residual wrong) pushes tokens toward the likely end, which lands u near 0.
A per-position test on a few dozen tokens has no power, and comparing against target-only samples needs
thousands of sequences; the PIT needs only one teacher-forced target forward per answer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from scipy.stats import chisquare

from engine.config import SamplingConfig
from engine.backends.contract import Runner
from engine.decode.sampling import logits_to_probs

BINS = 5
MIN_TOKENS = 5 * BINS  # fewer: the chi-square approximation is poor, no verdict
ALPHA = 0.01  # a p-value below this says the tokens do not follow the target's distribution


@dataclass(frozen=True)
class FidelityCheck:
    n_tokens: int
    chi2: float | None
    p_value: float | None  # None: too few tokens for a verdict
    counts: tuple[int, ...]

    @property
    def passed(self) -> bool | None:
        return None if self.p_value is None else self.p_value >= ALPHA

    def to_dict(self) -> dict:
        return {"n_tokens": self.n_tokens, "chi2": self.chi2, "p_value": self.p_value, "counts": list(self.counts),
                "passed": self.passed}


def target_probs(target: Runner, prompt_ids: list[int], answer_ids: list[int],
                 sampling: SamplingConfig) -> torch.Tensor:
    """(len(answer), vocab): the target's distribution at each answer position, teacher-forced in one forward."""
    target.reset()
    logits = target.forward(prompt_ids + answer_ids, n_logits=len(answer_ids) + 1)[:-1]  # (n, vocab)
    target.reset()
    return logits_to_probs(logits, sampling)


def pit_values(p_target: torch.Tensor, answer_ids: list[int], generator: torch.Generator) -> list[float]:
    """p_target: (n, vocab). One u in [0, 1] per token (see the module docstring)."""
    idx = torch.tensor(answer_ids)
    p_tok = p_target[torch.arange(len(answer_ids)), idx]  # (n,)
    above = torch.where(p_target > p_tok[:, None], p_target, torch.zeros(())).sum(-1)  # (n,)
    ties = torch.where(p_target == p_tok[:, None], p_target, torch.zeros(())).sum(-1)  # (n,) x and its equals
    v = torch.rand(len(answer_ids), generator=generator)
    return (above + v * ties).clamp(0.0, 1.0).tolist()


def uniformity(values: list[float], bins: int = BINS) -> FidelityCheck:
    """Chi-square of the values against Uniform(0, 1) over ``bins`` equal bins."""
    counts = [0] * bins
    for u in values:
        counts[min(int(u * bins), bins - 1)] += 1
    if len(values) < MIN_TOKENS:
        return FidelityCheck(len(values), None, None, tuple(counts))
    result = chisquare(counts)
    return FidelityCheck(len(values), float(result.statistic), float(result.pvalue), tuple(counts))
