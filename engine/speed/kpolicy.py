"""How many tokens to draft next step: fixed, or chosen from measured acceptance and the cost model.

The adaptive policy asks the cost model (engine.speed.costmodel) for the k (0..k_max) with the most expected
tokens per second, E(alpha, k) / (k * t_draft + t_verify(k + 1)), for the measured per-token acceptance
alpha. k = 0 is a plain target step: when speculation is measurably losing, the policy falls back to it and
probes with a short draft every ``probe_every`` steps. Both policies keep the fitted costs for the stats.

Free drafts (one-hot: a prompt lookup, a cached answer) cost nothing to make but each token still widens the
verify forward, which on compute-bound hardware costs ``verify_per_token_s`` apiece. The adaptive policy caps
them with the same model at zero draft cost and their own measured acceptance (``free_limit``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Protocol

from engine.config import SpecConfig
from engine.speed.costmodel import CostFit, StepCosts


@dataclass(frozen=True)
class StepRecord:
    """What one draft-verify step did and took: what the k policy and the stats learn from, made once per step
    by the loop (engine/decode/speculative.py). A draft is a model's (``free`` False: each token cost a draft
    forward) or one-hot (``free``: a prompt lookup, a cached answer); a plain target step drafted nothing."""
    n_drafted: int  # draft tokens the target verified
    n_accepted: int  # of them, accepted
    n_fed: int  # tokens the target's forward took: the ones it had not seen, then the draft
    draft_s: float  # seconds to propose
    verify_s: float  # seconds of the target's forward and the accept rule
    free: bool = False  # a one-hot draft: it cost nothing to make

    @property
    def n_model_drafted(self) -> int:
        """Draft tokens a draft model made (0 for a free draft)."""
        return 0 if self.free else self.n_drafted

    @property
    def rejected(self) -> bool:
        """The target rejected one of the draft's tokens (the step ended on a corrected token)."""
        return self.n_accepted < self.n_drafted


@dataclass(frozen=True)
class KChoice:
    """A policy's decision for one step."""
    k: int  # draft tokens to ask for; 0 = a plain target step (free drafts may still come)
    fallback: bool = False  # speculation measured as losing: a plain target step, or a probe between them


class KPolicy(Protocol):
    def choose(self) -> KChoice: ...

    def free_limit(self) -> int | None: ...

    def update(self, step: StepRecord) -> None: ...

    @property
    def costs(self) -> StepCosts | None: ...


class FixedK:
    def __init__(self, k: int, prior: StepCosts | None = None):
        self.k = k
        self.fit = CostFit(prior)

    def choose(self) -> KChoice:
        return KChoice(self.k)

    def free_limit(self) -> int | None:
        """A fixed k leaves free drafts as the proposer made them."""
        return None

    def update(self, step: StepRecord) -> None:
        """A fixed k only records the costs (for the stats)."""
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()


class AdaptiveK:
    FREE_MAX = 32  # the longest free draft considered

    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 16, probe_every: int = 8,
                 decay: float = 0.8, prior: StepCosts | None = None):
        self.k, self.k_min, self.k_max, self.probe_every, self.decay = k_init, k_min, k_max, probe_every, decay
        self.accepted = 2.0  # decayed counts of accepted / rejected draft tokens (a weak prior: a = 2/3)
        self.rejected = 1.0
        self.fit = CostFit(prior)
        self._since_probe = 0  # fallback steps since the last probe
        self.free_accepted, self.free_rejected = 4.0, 1.0  # free drafts: a weak prior of 0.8

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()

    def choose(self) -> KChoice:
        """The next step's k. Called once per step: each fallback step counts toward the next probe."""
        costs = self.costs
        if costs is None:
            return KChoice(self.k)
        best = costs.best_k(self.alpha, [0, *range(self.k_min, self.k_max + 1)])
        if best == 0:
            self._since_probe += 1
            if self._since_probe >= self.probe_every:  # probe: measure acceptance again
                self._since_probe = 0
                return KChoice(self.k_min, fallback=True)
        self.k = best
        return KChoice(best, fallback=best == 0)

    def free_limit(self) -> int | None:
        """The free-draft length with the most expected tokens per second (None until costs are known); at
        least 1, so their acceptance stays measured."""
        costs = self.costs
        if costs is None:
            return None
        alpha = self.free_accepted / (self.free_accepted + self.free_rejected)
        return replace(costs, draft_per_token_s=0.0).best_k(alpha, list(range(1, self.FREE_MAX + 1)))

    def update(self, step: StepRecord) -> None:
        """Feedback from one step: its timings feed the cost model, its acceptance the alpha of its kind of
        draft (a model's or a free one; a plain target step drafted nothing and teaches no alpha)."""
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)
        if step.n_drafted == 0:
            return
        if step.free:
            self.free_accepted = self.decay * self.free_accepted + step.n_accepted
            self.free_rejected = self.decay * self.free_rejected + step.rejected
        else:
            self.accepted = self.decay * self.accepted + step.n_accepted
            self.rejected = self.decay * self.rejected + step.rejected


def policy_for(spec: SpecConfig, prior: StepCosts | None = None) -> KPolicy:
    """The policy for ``spec``; ``prior`` (the pair's calibration) starts its cost model."""
    if spec.adaptive:
        return AdaptiveK(k_init=min(max(spec.k, spec.k_min), spec.k_max), k_min=spec.k_min, k_max=spec.k_max,
                         prior=prior)
    return FixedK(spec.k, prior=prior)
