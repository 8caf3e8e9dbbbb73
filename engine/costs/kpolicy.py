"""How many tokens to draft next step: fixed, or chosen from measured acceptance and the cost model.

The adaptive policy asks the cost model (engine.costs.costmodel) for the k (0..k_max) with the most expected
tokens per second, E(alpha, k) / (k * t_draft + t_verify(k + 1)), for the measured per-token acceptance
alpha. k = 0 is a plain target step: when speculation is measurably losing, the policy falls back to it and
probes with a short draft every ``probe_every`` steps. Both policies keep the fitted costs for the stats.

Free drafts (one-hot: a prompt lookup, a prediction, a cached answer) cost nothing to make but each token still
widens the verify forward, which on compute-bound hardware costs ``verify_per_token_s`` apiece. Both policies price
them (``FreeDrafts``) on the measured curve (up to FREE_SPAN tokens) at zero draft cost, with the acceptance of
their evidence class (a source, and whether the answer is following it or it was found again by a match): a span
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

from dataclasses import dataclass, replace
from typing import Protocol

from engine.config import FREE_PROPOSERS, FREE_SPAN, SpecConfig
from engine.costs.costmodel import CostFit, StepCosts


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
    source: str = ""  # who drafted it (Draft.source): the stats count each source's acceptance apart
    evidence: str = ""  # a free draft's evidence class (Draft.evidence_class): FreeDrafts prices each apart

    @property
    def n_model_drafted(self) -> int:
        """Draft tokens a draft model made (0 for a free draft)."""
        return 0 if self.free else self.n_drafted

    @property
    def rejected(self) -> bool:
        """The target rejected one of the draft's tokens (the step ended on a corrected token)."""
        return self.n_accepted < self.n_drafted


ALPHA_CEILING = 0.9  # the best per-token acceptance a draft model is credited with when asking if it could ever pay
HORIZON = 64  # tokens a catch-up is paid back over when the answer's room is not known


class Backoff:
    """When to probe a losing proposer again: every ``base`` steps, doubling up to ``most`` while probes keep
    finding a loss; ``paid`` starts over."""

    def __init__(self, base: int = 8, most: int = 64):
        self.base, self.most = base, most
        self.every, self.waited = base, 0

    def due(self) -> bool:
        """Count one losing step; True when it is the probe's turn (and the next probe waits longer)."""
        self.waited += 1
        if self.waited < self.every:
            return False
        self.waited, self.every = 0, min(self.every * 2, self.most)
        return True

    def paid(self) -> None:
        self.every, self.waited = self.base, 0


class _Counts:
    """Decayed counts of accepted and rejected free-draft tokens, and when to probe again."""

    def __init__(self, probe_every: int):
        self.accepted = self.rejected = 0.0
        self.probes = Backoff(probe_every)

    def add(self, decay: float, accepted: int, rejected: int) -> None:
        self.accepted = decay * self.accepted + accepted
        self.rejected = decay * self.rejected + rejected

    def alpha(self, prior: float, weight: float) -> float:
        """The acceptance these counts say, starting from ``prior`` worth ``weight`` tokens."""
        return (self.accepted + prior * weight) / (self.accepted + self.rejected + weight)


class FreeDrafts:
    """Prices one-hot drafts (known text) on the measured curve by their evidence: each class (a source and why it
    drafts, ``Draft.evidence_class``: a prediction the answer is following, a prompt lookup after a 3-token match, ...)
    learns its own decayed acceptance. Known text is copied or it is not: a span the answer has followed so far is
    likely followed on (a strong prior, FOLLOWING); any other class starts from what its source has shown so far (all
    its classes pooled, from a weak PRIOR worth one token), so a right prediction is verified wide from its first
    followed span and a wrong source stops after a failed span or two, probed now and then (``Backoff``, per class)
    so that its acceptance stays measured."""
    MOST = FREE_SPAN  # the longest free draft considered
    PRIOR = (0.8, 1.0)  # (acceptance, weight in tokens): a prompt with nothing to copy stops paying after a span or two
    FOLLOWING = (0.95, 2.0)  # the answer took this source's last span whole

    def __init__(self, probe_every: int = 8, decay: float = 0.8):
        self.decay, self.probe_every = decay, probe_every
        self.classes: dict[str, _Counts] = {}
        self.sources: dict[str, _Counts] = {}

    def _counts(self, table: dict[str, _Counts], key: str) -> _Counts:
        found = table.get(key)
        if found is None:
            found = table[key] = _Counts(self.probe_every)
        return found

    def alpha(self, evidence: str = "") -> float:
        """The acceptance a draft of class ``evidence`` is priced with."""
        if evidence.endswith("/following"):
            prior = self.FOLLOWING
        else:
            source = self.sources.get(evidence.split("/")[0])
            prior = (source.alpha(*self.PRIOR), self.PRIOR[1]) if source else self.PRIOR
        return self._counts(self.classes, evidence).alpha(*prior)

    def limit(self, costs: StepCosts | None, evidence: str = "", most: int = FREE_SPAN) -> int | None:
        """The free-draft length (up to ``most``: the draft's length, the room) with the most expected tokens per
        second for a draft of class ``evidence``, 0 where none beats a target-only step (then now and then a probe,
        so its acceptance stays measured: the shortest span that would pay if ALPHA_CEILING of it were right; none
        where no span could); None until costs are known. Priced among the lengths that can be kept: where the curve
        has a bump (t(8) above t(16)), the best of all lengths cut to ``most`` may be one of the worst."""
        if costs is None:
            return None
        most = min(most, self.MOST)
        free = replace(costs, draft_per_token_s=0.0)
        best = free.best_k(self.alpha(evidence), list(range(most + 1)))
        probes = self._counts(self.classes, evidence).probes
        if best:
            probes.paid()
            return best
        if not probes.due():  # most losing steps: no pricing of a probe on the token loop
            return 0
        return next((k for k in range(1, most + 1) if free.speedup(ALPHA_CEILING, k) > 1.0), 0)

    def update(self, step: StepRecord) -> None:
        if step.free and step.n_drafted:
            for table, key in ((self.classes, step.evidence), (self.sources, step.evidence.split("/")[0])):
                self._counts(table, key).add(self.decay, step.n_accepted, step.rejected)


@dataclass(frozen=True)
class KChoice:
    """A policy's decision for one step."""
    k: int  # draft tokens to ask for; 0 = a plain target step (free drafts may still come)
    fallback: bool = False  # speculation measured as losing: a plain target step, or a probe between them
    waiting: bool = False  # no draft at all: this machine's step costs are still being measured


class KPolicy(Protocol):
    def choose(self, remaining: int | None = None) -> KChoice: ...  # remaining: tokens the answer may still have

    # asked once per free draft, with its evidence class and the longest it could be kept (its length, the room)
    def free_limit(self, evidence: str = "", most: int = FREE_SPAN) -> int | None: ...

    def update(self, step: StepRecord) -> None: ...

    @property
    def costs(self) -> StepCosts | None: ...


class FixedK:
    def __init__(self, k: int, prior: StepCosts | None = None):
        self.k = k
        self.fit = CostFit(prior)
        self.free = FreeDrafts()

    def choose(self, remaining: int | None = None) -> KChoice:
        return KChoice(self.k)

    def free_limit(self, evidence: str = "", most: int = FREE_SPAN) -> int | None:
        """Free drafts are priced as under the adaptive policy, by their evidence (``FreeDrafts``)."""
        return self.free.limit(self.costs, evidence, most)

    def update(self, step: StepRecord) -> None:
        """A fixed k records the costs (for the stats, and to price free drafts)."""
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)
        self.free.update(step)

    @property
    def costs(self) -> StepCosts | None:
        return self.fit.costs()


class AdaptiveK:
    def __init__(self, k_init: int = 4, k_min: int = 1, k_max: int = 16, probe_every: int = 8,
                 decay: float = 0.8, prior: StepCosts | None = None, behind: int = 0):
        self.k, self.k_min, self.k_max, self.probe_every, self.decay = k_init, k_min, k_max, probe_every, decay
        self.accepted = 2.0  # decayed counts of accepted / rejected draft tokens (a weak prior: a = 2/3)
        self.rejected = 1.0
        self.fit = CostFit(prior)
        self.probes = Backoff(probe_every)  # when a losing draft model is tried again
        self.free = FreeDrafts(probe_every, decay)
        self.behind = behind  # tokens the draft model must be fed before its next drafted token (its catch-up)
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

    def choose(self, remaining: int | None = None) -> KChoice:
        """The next step's k (``remaining``: tokens the answer may still have). Called once per step: each fallback
        step counts toward the next probe, where a draft could pay at all."""
        costs = self.costs
        if costs is None:
            return KChoice(self.k)
        best = self._paying_k(costs, self.alpha, remaining)
        if best == 0:
            if self.probes.due() and self._paying_k(costs, ALPHA_CEILING, remaining):  # probe: measure alpha again
                return KChoice(self.k_min, fallback=True)
            return KChoice(0, fallback=True)
        self.probes.paid()
        self.k = best
        return KChoice(best)

    def _paying_k(self, costs: StepCosts, alpha: float, remaining: int | None) -> int:
        """The k with the most expected tokens per second at ``alpha``, or 0 where drafting loses: where that k's
        saving over the tokens still to come does not pay for the draft model's catch-up."""
        best = costs.best_k(alpha, [0, *range(self.k_min, self.k_max + 1)])
        horizon = HORIZON if remaining is None else remaining
        if best and costs.saving_per_token_s(alpha, best) * horizon <= costs.catch_up_s(self.behind):
            return 0
        return best

    def free_limit(self, evidence: str = "", most: int = FREE_SPAN) -> int | None:
        """How long a free draft of class ``evidence`` may be (``FreeDrafts.limit``): 0 where none pays."""
        return self.free.limit(self.costs, evidence, most)

    def update(self, step: StepRecord) -> None:
        """Feedback from one step: its timings feed the cost model, its acceptance the alpha of its kind of
        draft (a model's or a free one; a plain target step drafted nothing and teaches no alpha). A step whose
        draft model caught up first teaches the catch-up's price, not the drafted token's."""
        caught_up = self.behind if step.n_model_drafted else 0
        self.fit.observe(step.n_fed, step.verify_s, 0 if caught_up else step.n_model_drafted, step.draft_s)
        if caught_up and self.fit.draft_per_token_s is not None:
            per_token = max(step.draft_s - step.n_model_drafted * self.fit.draft_per_token_s, 0.0) / caught_up
            known = self.catch_up_per_token_s
            self.catch_up_per_token_s = per_token if known is None else 0.7 * known + 0.3 * per_token
        self.free.update(step)
        if step.n_drafted and not step.free:
            self.accepted = self.decay * self.accepted + step.n_accepted
            self.rejected = self.decay * self.rejected + step.rejected
        # what the draft model will have to feed: after its own draft, the target's token (and the last drafted
        # one, never fed, when all were taken); else everything the target took since
        self.behind = int(step.n_accepted == step.n_drafted) if step.n_model_drafted else \
            self.behind + step.n_fed - step.n_drafted + step.n_accepted


class Waiting:
    """An adaptive k before this machine's step costs are measured (engine/serve/measuring.py): target-only steps,
    no draft of any kind, so nothing is priced on a guess and the answer is the target's own."""

    def __init__(self):
        self.fit = CostFit(None)

    def choose(self, remaining: int | None = None) -> KChoice:
        return KChoice(0, fallback=True, waiting=True)

    def free_limit(self, evidence: str = "", most: int = FREE_SPAN) -> int | None:
        return 0

    def update(self, step: StepRecord) -> None:
        self.fit.observe(step.n_fed, step.verify_s, step.n_model_drafted, step.draft_s)

    @property
    def costs(self) -> StepCosts | None:
        return None


def policy_for(spec: SpecConfig, prior: StepCosts | None = None, prompt_tokens: int = 0) -> KPolicy:
    """The policy for ``spec``; ``prior`` (the pair's step costs measured at load) starts its cost model, and the
    draft model starts ``prompt_tokens`` behind (a new answer's draft has not seen its prompt)."""
    if spec.adaptive and spec.proposer in FREE_PROPOSERS:  # no draft model to size: its free drafts are offered up
        return FixedK(max(spec.k_max, FREE_SPAN), prior=prior)  # to FREE_SPAN long, and FreeDrafts prices them
    if spec.adaptive:
        return AdaptiveK(k_init=min(max(spec.k, spec.k_min), spec.k_max), k_min=spec.k_min, k_max=spec.k_max,
                         prior=prior, behind=prompt_tokens)
    return FixedK(spec.k, prior=prior)
