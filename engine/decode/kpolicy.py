"""How much to draft next step, said once per step as a ``StepBudget`` (engine/decode/step.py): fixed, or chosen from
measured acceptance and the cost model (engine/costs/costmodel.py).

The adaptive policy asks the cost model (engine.costs.costmodel) for the k (0..k_max) with the most expected
tokens per second, E(alpha, k) / (k * t_draft + t_verify(k + 1)), for the measured per-token acceptance
alpha. k = 0 is a plain target step: when speculation is measurably losing, the policy falls back to it and
probes with a short draft every ``probe_every`` steps. Both policies keep the fitted costs for the stats.

Free drafts (one-hot: a prompt lookup, a prediction, a cached answer) cost nothing to make but each token still
widens the verify forward, which on compute-bound hardware costs ``verify_per_token_s`` apiece. Both policies price
them (``FreeDrafts``, engine/decode/free_drafts.py) on the measured curve (up to FREE_SPAN tokens) at zero draft
cost, by what the answer did with the recent spans of their evidence class (a source, and whether the answer is
following it or it was found again by a match): a span
is cut to the length whose expected tokens pay for its width, and where none pays the step is target-only, with a
short probe now and then. Probes back off (8, 16, 32, 64 steps) while they keep finding a loss: no proposer runs at a
loss for long. A fixed k with a draft model is the one exception, on purpose: an experiment shows what it costs.

A draft model that has not drafted for a while must first be fed every token it missed (its catch-up: the
prompt, on the first draft of an answer). The adaptive policy prices that too: it drafts only where the saving
over the tokens still to come pays for the catch-up, and it probes only where a draft accepted ALPHA_CEILING of
the time could pay on this machine's measured costs. Where none could, the draft model never runs: a step costs
what a target-only step costs.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Protocol

from engine.config import FREE_PROPOSERS, FREE_SPAN, SpecConfig
from engine.costs.costmodel import CostFit, StepCosts
from engine.decode.free_drafts import ALPHA_CEILING, Backoff, FreeDrafts
from engine.decode.step import StepBudget, StepRecord


HORIZON = 64  # tokens a catch-up is paid back over when the answer's room is not known


class KPolicy(Protocol):
    def budget(self, remaining: int | None = None, unseen: int = 1, behind: int = 0) -> StepBudget:
        """Once per step, what it may draft (engine/decode/step.py): ``remaining`` tokens the answer may still have,
        ``unseen`` context tokens the target has not taken (more than one: fed alone, no draft), ``behind`` tokens
        the draft model must catch up on before its first drafted token (``Proposer.behind``)."""

    def update(self, step: StepRecord) -> None: ...

    @property
    def costs(self) -> StepCosts | None: ...


class FixedK:
    """The user's k, as asked: a draft model drafts k tokens every step; free drafts are offered up to ``span`` and
    priced by their evidence (``FreeDrafts``). ``width``: the widest verify a step may feed (None: any)."""

    def __init__(self, k: int, prior: StepCosts | None = None, span: int = FREE_SPAN, width: int | None = None):
        self.k, self.span, self.width = k, span, width
        self.fit = CostFit(prior)
        self.free = FreeDrafts()

    def budget(self, remaining: int | None = None, unseen: int = 1, behind: int = 0) -> StepBudget:
        return StepBudget.within(self.k, self.span, f"fixed k {self.k}", remaining=remaining, unseen=unseen,
                                 width=self.width, price=self._price)

    def _price(self, evidence: str, most: int) -> int | None:
        return self.free.limit(self.costs, evidence, most)

    def update(self, step: StepRecord) -> None:
        """A fixed k records the costs (for the stats, and to price free drafts)."""
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)
        self.free.update(step)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()


class AdaptiveK:
    """The k with the most expected tokens per second on the measured costs, within ``k_max`` and the verify
    ``width`` (k <= width - 1); 0 (a target-only step, probed now and then) where drafting loses, the draft
    model's catch-up priced in."""

    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 16, probe_every: int = 8,
                 decay: float = 0.8, prior: StepCosts | None = None, width: int | None = None):
        most = k_max if not width else min(k_max, width - 1)
        self.k_min, self.k_max, self.width, self.decay = min(k_min, most), most, width, decay
        self.k = min(max(k_init, self.k_min), most)
        self.accepted = 2.0  # decayed counts of accepted / rejected draft tokens (a weak prior: a = 2/3)
        self.rejected = 1.0
        self.fit = CostFit(prior)
        self.probes = Backoff(probe_every)  # when a losing draft model is tried again
        self.free = FreeDrafts(probe_every, decay)
        self.catch_up_per_token_s: float | None = None  # measured on the steps that caught up

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejected)

    @property
    def costs(self) -> StepCosts | None:
        costs = self.fit.costs()
        if costs is None or self.catch_up_per_token_s is None:
            return costs
        return replace(costs, catch_up_per_token_s=self.catch_up_per_token_s)

    def budget(self, remaining: int | None = None, unseen: int = 1, behind: int = 0) -> StepBudget:
        """The next step's budget. Called once per step: each fallback step counts toward the next probe, where a
        draft could pay at all."""
        k, why, fallback = self._choose(remaining, behind)
        return StepBudget.within(k, FREE_SPAN, why, remaining=remaining, unseen=unseen, width=self.width,
                                 fallback=fallback, price=self._price)

    def _choose(self, remaining: int | None, behind: int) -> tuple[int, str, bool]:
        costs = self.costs
        if costs is None:
            return self.k, f"adaptive k {self.k} (no costs yet)", False
        best = self._paying_k(costs, self.alpha, remaining, behind)
        if best == 0:
            if self.probes.due() and self._paying_k(costs, ALPHA_CEILING, remaining, behind):  # measure alpha again
                return self.k_min, f"probe: k {self.k_min} (drafting loses at acceptance {self.alpha:.2f})", True
            return 0, f"target-only: drafting loses at acceptance {self.alpha:.2f}", True
        self.probes.paid()
        self.k = best
        return best, f"adaptive k {best} (acceptance {self.alpha:.2f})", False

    def _paying_k(self, costs: StepCosts, alpha: float, remaining: int | None, behind: int) -> int:
        """The k with the most expected tokens per second at ``alpha``, or 0 where drafting loses: where that k's
        saving over the tokens still to come does not pay for the draft model's catch-up (``behind`` tokens)."""
        best = costs.best_k(alpha, [0, *range(self.k_min, self.k_max + 1)])
        horizon = HORIZON if remaining is None else remaining
        if best and costs.saving_per_token_s(alpha, best) * horizon <= costs.catch_up_s(behind):
            return 0
        return best

    def _price(self, evidence: str, most: int) -> int | None:
        """How long a free draft of class ``evidence`` may be (``FreeDrafts.limit``): 0 where none pays."""
        return self.free.limit(self.costs, evidence, most)

    def update(self, step: StepRecord) -> None:
        """Feedback from one step: its timings feed the cost model, its acceptance the alpha of its kind of
        draft (a model's or a free one; a plain target step drafted nothing and teaches no alpha). A step whose
        draft model caught up first (what it fed, ``StepRecord.caught_up``) teaches the catch-up's price, not the
        drafted token's."""
        caught_up = step.caught_up
        self.fit.observe(step.n_fed, step.verify_s, 0 if caught_up else step.n_model_drafted, step.draft_s)
        if caught_up and self.fit.draft_per_token_s is not None:
            per_token = max(step.draft_s - step.n_model_drafted * self.fit.draft_per_token_s, 0.0) / caught_up
            known = self.catch_up_per_token_s
            self.catch_up_per_token_s = per_token if known is None else 0.7 * known + 0.3 * per_token
        self.free.update(step)
        if step.n_drafted and not step.free:
            self.accepted = self.decay * self.accepted + step.n_accepted
            self.rejected = self.decay * self.rejected + step.rejected


class Waiting:
    """An adaptive k before this machine's step costs are measured (engine/serve/measuring.py): target-only steps,
    no draft of any kind, so nothing is priced on a guess and the answer is the target's own."""

    def __init__(self):
        self.fit = CostFit(None)

    def budget(self, remaining: int | None = None, unseen: int = 1, behind: int = 0) -> StepBudget:
        return StepBudget(0, 0, "waiting for this machine's step costs", fallback=True, waiting=True)

    def update(self, step: StepRecord) -> None:
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)

    @property
    def costs(self) -> StepCosts | None:
        return None


def policy_for(spec: SpecConfig, prior: StepCosts | None = None, width: int | None = None) -> KPolicy:
    """The policy for ``spec``; ``prior`` (the pair's step costs measured at load) starts its cost model; ``width``:
    the widest verify an adaptive k keeps to (the identical mode's; a fixed k is the user's choice)."""
    if spec.adaptive and spec.proposer in FREE_PROPOSERS:  # no draft model to size: free drafts are offered up to
        return FixedK(0, prior=prior, width=width)  # FREE_SPAN long, and FreeDrafts prices them
    if spec.adaptive:
        return AdaptiveK(k_init=spec.k, k_min=spec.k_min, k_max=spec.k_max, prior=prior, width=width)
    if spec.proposer in FREE_PROPOSERS:  # the user's k sizes a lookup's drafts
        return FixedK(spec.k, prior=prior, span=spec.k)
    return FixedK(spec.k, prior=prior)
