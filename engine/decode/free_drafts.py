"""Known text priced by its evidence: one-hot drafts (a prediction, a prompt lookup, a cached answer, the memory)
cost nothing to make, but each token widens the verify forward. ``FreeDrafts`` cuts each span to the length whose
expected tokens pay for its width on the measured curve, from what the answer did with the recent spans of the same
evidence class; the k policies (engine/decode/kpolicy.py) ask it once per step."""
from __future__ import annotations

from collections import deque
from dataclasses import replace

from engine.config import FREE_SPAN
from engine.costs.costmodel import StepCosts, expected_tokens
from engine.decode.step import StepRecord


ALPHA_CEILING = 0.9  # the best per-token acceptance a draft model is credited with when asking if it could ever pay


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
    """Decayed counts of a source's accepted and rejected free-draft tokens."""

    def __init__(self):
        self.accepted = self.rejected = 0.0

    def add(self, decay: float, accepted: int, rejected: int) -> None:
        self.accepted = decay * self.accepted + accepted
        self.rejected = decay * self.rejected + rejected

    def alpha(self, prior: float, weight: float) -> float:
        """The acceptance these counts say, starting from ``prior`` worth ``weight`` tokens."""
        return (self.accepted + prior * weight) / (self.accepted + self.rejected + weight)


class _Runs:
    """The recent spans of one evidence class, newest first: how many tokens of each the answer took (its run) and
    whether it took it whole; and when to probe the class again."""
    KEEP = 8

    def __init__(self, probe_every: int):
        self.spans: deque[tuple[int, bool]] = deque(maxlen=self.KEEP)
        self.probes = Backoff(probe_every)

    def copying(self) -> float:
        """The per-token acceptance past the end of a span taken whole: this class's tokens taken per token and
        departure, from FOLLOWING's prior (so a run of whole spans is priced wider each time)."""
        taken = sum(run for run, _ in self.spans)
        left = sum(not whole for _, whole in self.spans)
        alpha, weight = FreeDrafts.FOLLOWING
        return (taken + alpha * weight) / (taken + left + weight)

    def expected(self, most: int, prior: float, weight: float, decay: float) -> list[float]:
        """For k = 0..most, the tokens of a k-token span the answer is expected to take: each recent span's run cut
        to k (one taken whole goes on as its class copies, ``copying``), the newer spans weighing
        ``decay`` times more, beside a geometric prior of acceptance ``prior`` worth ``weight`` spans, as old as the
        oldest. Known text is copied or it is not: a long run does not make the next span's first tokens likelier
        where the answer has just left its source, as a per-token acceptance would."""
        copied, guessed = _geometric(self.copying(), most), _geometric(prior, most)
        total, weights, w = [0.0] * (most + 1), 0.0, 1.0
        for run, whole in self.spans:
            for k in range(most + 1):
                total[k] += w * (min(run, k) + (copied[k - run] if whole and k > run else 0.0))
            weights, w = weights + w, w * decay
        w *= weight
        return [(t + w * g) / (weights + w) for t, g in zip(total, guessed)]


def _geometric(alpha: float, most: int) -> list[float]:
    """For k = 0..most, the tokens of a k-token span taken when each is taken with probability ``alpha``."""
    return [expected_tokens(alpha, k) - 1.0 for k in range(most + 1)]


class FreeDrafts:
    """Prices one-hot drafts (known text) on the measured curve by their evidence: each class (a source and why it
    drafts, ``Draft.evidence_class``: a prediction the answer is following, a prompt lookup after a 3-token match, ...)
    learns from its own recent spans how far the answer took them (``_Runs``). A span the answer has followed so far
    is likely followed on (a strong prior, FOLLOWING); any other class starts from what its source has shown so far
    (its classes' tokens pooled, from a weak PRIOR), so a right prediction is verified wide from its first followed
    span, and a class whose spans the answer leaves after a token or two is priced by those runs within a span or two:
    narrow probes, then none, probed now and then (``Backoff``, per class) so that it stays measured."""
    MOST = FREE_SPAN  # the longest free draft considered
    # (acceptance, weight) of a class whose source has no record yet: below what a wide span needs even where t(16) is
    # cheap, so an unproven match is not a wide gamble (a failed wide verify costs several forwards); it is drafted
    # once the answer follows it (FOLLOWING) or its source has paid (docs/bench.md, "The prior of an unproven match").
    PRIOR = (0.65, 1.0)  # weight in tokens of the source's pooled record
    # the answer took this source's last span whole, or came back to it (``rejoined``): a class's prior, and what a
    # span taken whole goes on with (weight in tokens)
    FOLLOWING = (0.95, 2.0)
    PRIOR_SPANS = 0.5  # a class's prior counts as half a span older than its oldest
    SPAN_DECAY = 0.5  # how much less each older span of a class counts

    def __init__(self, probe_every: int = 8, decay: float = 0.8):
        self.decay, self.probe_every = decay, probe_every
        self.classes: dict[str, _Runs] = {}
        self.sources: dict[str, _Counts] = {}

    def _runs(self, evidence: str) -> _Runs:
        found = self.classes.get(evidence)
        if found is None:
            found = self.classes[evidence] = _Runs(self.probe_every)
        return found

    def expected(self, evidence: str, most: int) -> list[float]:
        """For k = 0..most, the tokens of a k-token draft of class ``evidence`` the answer is expected to take."""
        if evidence.endswith(("/following", "/rejoined")):
            prior = self.FOLLOWING[0]
        else:
            source = self.sources.get(evidence.split("/")[0])
            prior = source.alpha(*self.PRIOR) if source else self.PRIOR[0]
        return self._runs(evidence).expected(most, prior, self.PRIOR_SPANS, self.SPAN_DECAY)

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
        best = free.best_of({k: 1.0 + taken for k, taken in enumerate(self.expected(evidence, most))})
        probes = self._runs(evidence).probes
        if best:
            probes.paid()
            return best
        if not probes.due():  # most losing steps: no pricing of a probe on the token loop
            return 0
        return next((k for k in range(1, most + 1) if free.speedup(ALPHA_CEILING, k) > 1.0), 0)

    def update(self, step: StepRecord) -> None:
        if step.unverified_agreed is not None:  # priced out, yet the target's token says how its first token did:
            self._runs(step.evidence).spans.appendleft((int(step.unverified_agreed), False))  # a run of 1 at most
        elif step.free and step.n_drafted:
            self._runs(step.evidence).spans.appendleft((step.n_accepted, not step.rejected))
            source = self.sources.setdefault(step.evidence.split("/")[0], _Counts())
            source.add(self.decay, step.n_accepted, step.rejected)
