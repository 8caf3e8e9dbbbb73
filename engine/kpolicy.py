"""How many tokens to draft next step: fixed, or chosen from measured acceptance and the cost model.

The adaptive policy asks the cost model (engine.costmodel) for the k (0..k_max) with the most expected
tokens per second, E(alpha, k) / (k * t_draft + t_verify(k + 1)), for the measured per-token acceptance
alpha. k = 0 is a plain target step: when speculation is measurably losing, the policy falls back to it and
probes with a short draft every ``probe_every`` steps. Both policies keep the fitted costs for the stats.
"""
from __future__ import annotations

from typing import Protocol

from engine.costmodel import CostFit, StepCosts, expected_tokens

__all__ = ["KPolicy", "FixedK", "AdaptiveK", "expected_tokens"]


class KPolicy(Protocol):
    fallback: bool

    def next_k(self) -> int: ...

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float, n_fed: int) -> None: ...

    @property
    def costs(self) -> StepCosts | None: ...


class FixedK:
    fallback = False

    def __init__(self, k: int, prior: StepCosts | None = None):
        self.k = k
        self.fit = CostFit(prior)

    def next_k(self) -> int:
        return self.k

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float, n_fed: int) -> None:
        """A fixed k only records the costs (for the stats)."""
        self.fit.observe(n_fed, verify_s, n_proposed, draft_s)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()


class AdaptiveK:
    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 16, probe_every: int = 8,
                 decay: float = 0.8, prior: StepCosts | None = None):
        self.k, self.k_min, self.k_max, self.probe_every, self.decay = k_init, k_min, k_max, probe_every, decay
        self.accepted = 2.0  # decayed counts of accepted / rejected draft tokens (a weak prior: a = 2/3)
        self.rejected = 1.0
        self.fit = CostFit(prior)
        self.fallback = False
        self._since_probe = 0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()

    def next_k(self) -> int:
        costs = self.costs
        if costs is None:
            return self.k
        best = costs.best_k(self.alpha, [0, *range(self.k_min, self.k_max + 1)])
        self.fallback = best == 0
        if self.fallback:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:  # probe: measure acceptance again
                self._since_probe = 0
                return self.k_min
        self.k = best
        return best

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float, n_fed: int) -> None:
        """Feedback from a step that fed ``n_fed`` tokens to the target after a model draft of ``n_proposed``
        tokens (0 = a plain target step, or a free draft such as a prompt lookup)."""
        self.fit.observe(n_fed, verify_s, n_proposed, draft_s)
        if n_proposed == 0:
            return
        self.accepted = self.decay * self.accepted + n_accepted
        self.rejected = self.decay * self.rejected + (1 if n_accepted < n_proposed else 0)
