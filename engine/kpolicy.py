"""How many tokens to draft next step: fixed, or chosen from measured acceptance and costs.

The adaptive policy models a step as: draft k tokens at ``t_draft`` each, verify at ``t_verify``, and gain
E(k) = (1 - a^(k+1)) / (1 - a) tokens for a per-token acceptance ``a``. It picks the k (0..k_max) with the
best E(k) / (k * t_draft + t_verify). k = 0 is a plain target step: when speculation is measurably losing,
the policy falls back to it and probes with a short draft every ``probe_every`` steps.
"""
from __future__ import annotations

from typing import Protocol


class KPolicy(Protocol):
    fallback: bool

    def next_k(self) -> int: ...

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float) -> None: ...


class FixedK:
    fallback = False

    def __init__(self, k: int):
        self.k = k

    def next_k(self) -> int:
        return self.k

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float) -> None:
        """A fixed k ignores feedback."""


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one step yields with k drafted tokens, each accepted with probability alpha (plus the target's)."""
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


class AdaptiveK:
    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 16, probe_every: int = 8,
                 decay: float = 0.8):
        self.k, self.k_min, self.k_max, self.probe_every, self.decay = k_init, k_min, k_max, probe_every, decay
        self.accepted = 2.0  # decayed counts of accepted / rejected draft tokens (a weak prior: a = 2/3)
        self.rejected = 1.0
        self.t_draft: float | None = None  # seconds per drafted token
        self.t_verify: float | None = None  # seconds per target forward
        self.fallback = False
        self._since_probe = 0
        self._steps = 0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    def next_k(self) -> int:
        if self.t_draft is None or self.t_verify is None:
            return self.k
        rate = {k: expected_tokens(self.alpha, k) / (k * self.t_draft + self.t_verify)
                for k in [0, *range(self.k_min, self.k_max + 1)]}
        best = max(rate, key=rate.get)
        self.fallback = best == 0
        if self.fallback:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:  # probe: measure acceptance again
                self._since_probe = 0
                return self.k_min
        self.k = best
        return best

    def update(self, n_accepted: int, n_proposed: int, draft_s: float, verify_s: float) -> None:
        """Feedback from a step with a model draft of ``n_proposed`` tokens (0 = a plain target step)."""
        first = self._steps == 0  # the first step also prefills the prompt: its timings say nothing
        self._steps += 1
        if not first:
            self.t_verify = verify_s if self.t_verify is None else 0.7 * self.t_verify + 0.3 * verify_s
        if n_proposed == 0:
            return
        if not first:
            per_token = draft_s / n_proposed
            self.t_draft = per_token if self.t_draft is None else 0.7 * self.t_draft + 0.3 * per_token
        self.accepted = self.decay * self.accepted + n_accepted
        self.rejected = self.decay * self.rejected + (1 if n_accepted < n_proposed else 0)
