"""What a speculation step costs, as a function of the draft length k. Pure Python (the app imports it).

A step drafts k tokens at ``draft_per_token_s`` each and runs one target forward over the k+1 tokens it
feeds. ``verify_s(n)`` is the precision's own measured curve where there is one (``verify_table``: a 4-bit
target on a CPU costs 1.45x a one-token forward at n = 4 and 2.8x at n = 8: flat while the weights' bytes
dominate, then steep), else the line ``verify_fixed_s + verify_per_token_s * n``. Where the target's matmuls are
memory-bound (a GPU, AMX) the curve is flat and long drafts pay; where they are compute-bound (bf16 without
native support) verifying k+1 tokens costs about k+1 single-token forwards and they do not. ``CostFit`` keeps
both online from the steps, anchored by the step costs measured at load.
"""
from __future__ import annotations

from dataclasses import dataclass


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens one step yields with k drafted tokens, each accepted with probability alpha (plus the target's)."""
    alpha = min(max(alpha, 0.0), 1.0)
    return float(k + 1) if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)


@dataclass(frozen=True)
class StepCosts:
    verify_fixed_s: float  # a: seconds of a target forward whatever its length
    verify_per_token_s: float  # b: seconds per token fed to that forward
    draft_per_token_s: float  # seconds per drafted token
    # measured (n_fed, seconds), n ascending; with two points or more it replaces the line
    verify_table: tuple[tuple[int, float], ...] = ()
    # seconds per token the draft model feeds to catch up (a batch, cheaper than drafting one): None = not measured,
    # then ``draft_per_token_s`` prices it
    catch_up_per_token_s: float | None = None

    def catch_up_s(self, behind: int) -> float:
        """What feeding the draft model ``behind`` tokens it has not seen costs, before its first drafted token."""
        per_token = self.draft_per_token_s if self.catch_up_per_token_s is None else self.catch_up_per_token_s
        return max(behind, 0) * per_token

    def saving_per_token_s(self, alpha: float, k: int) -> float:
        """Seconds a step drafting k tokens saves per emitted token against target-only (negative: it loses)."""
        return self.verify_s(1) - self.step_s(k) / expected_tokens(alpha, k)

    def verify_s(self, n_fed: int) -> float:
        if len(self.verify_table) < 2:
            return self.verify_fixed_s + self.verify_per_token_s * n_fed
        return interpolate(self.verify_table, n_fed)

    def step_s(self, k: int) -> float:
        """Draft k tokens, then verify the k+1 fed tokens (the last new token plus the draft)."""
        return k * self.draft_per_token_s + self.verify_s(k + 1)

    def tokens_per_s(self, alpha: float, k: int) -> float:
        return expected_tokens(alpha, k) / self.step_s(k)

    def speedup(self, alpha: float, k: int) -> float:
        """Expected speed with draft length k over target-only decoding (k = 0 gives 1)."""
        return self.tokens_per_s(alpha, k) * self.verify_s(1)

    def best_k(self, alpha: float, candidates: list[int]) -> int:
        """The candidate with the most expected tokens per second (ties: the shorter draft)."""
        return self.best_of({k: expected_tokens(alpha, k) for k in candidates})

    def best_of(self, yields: dict[int, float]) -> int:
        """The draft length k with the most tokens per second, ``yields[k]`` the tokens a step drafting k is expected
        to give (the target's own included), however that was estimated (ties: the shorter draft)."""
        return max(sorted(yields), key=lambda k: (yields[k] / self.step_s(k), -k))


def interpolate(table: tuple[tuple[int, float], ...], n: float) -> float:
    """Piecewise-linear t(n) through the points of ``table`` (n ascending), extended by its end segments."""
    i = next((i for i in range(1, len(table) - 1) if n <= table[i][0]), len(table) - 1)
    (n0, t0), (n1, t1) = table[i - 1], table[i]
    return max(t0 + (t1 - t0) * (n - n0) / (n1 - n0), 1e-9)


def fit_line(ns: list[float], ts: list[float], weights: list[float] | None = None) -> tuple[float, float]:
    """Weighted least squares t = a + b*n, with a, b >= 0. All n equal: a flat line through their mean."""
    weights = weights or [1.0] * len(ns)
    sw = sum(weights)
    mean_n = sum(w * n for w, n in zip(weights, ns)) / sw
    mean_t = sum(w * t for w, t in zip(weights, ts)) / sw
    var = sum(w * (n - mean_n) ** 2 for w, n in zip(weights, ns))
    b = 0.0 if var <= 1e-12 * sw else max(0.0, sum(w * (n - mean_n) * (t - mean_t)
                                                  for w, n, t in zip(weights, ns, ts)) / var)
    a = mean_t - b * mean_n
    if a < 0:  # a line through the origin instead
        a, b = 0.0, sum(w * n * t for w, n, t in zip(weights, ns, ts)) / sum(w * n * n for w, n in zip(weights, ns))
    return a, b


class CostFit:
    """Online estimate of StepCosts from step timings.

    Verify timings are kept as decayed (n_fed, seconds) points; the costs measured at load (``prior``) add their
    measured points (or their line at n = 1 and n = ``PRIOR_SPAN``) with weight ``prior_weight``, so the curve
    stays defined where k does not go. The curve is the weighted mean time per n, as measured; the line
    is fitted to the same points (for the stats). The draft cost per token is an exponential average started at
    the prior's.
    """
    PRIOR_SPAN = 8

    def __init__(self, prior: StepCosts | None = None, decay: float = 0.9, prior_weight: float = 1.0):
        self.decay, self.prior_weight = decay, prior_weight
        self.prior = prior
        self.points: list[tuple[int, float, float]] = []  # (n_fed, seconds, weight)
        self.draft_per_token_s = prior.draft_per_token_s if prior else None
        self._first = True
        self._fitted: StepCosts | None = None  # the fit of the current points, until the next observation

    def observe(self, n_fed: int, verify_s: float, n_drafted: int, draft_s: float) -> None:
        """One step's timings. The first step also prefills the prompt: it says nothing about a step."""
        if self._first:
            self._first = False
            return
        self._fitted = None
        self.points = [(n, t, w * self.decay) for n, t, w in self.points if w * self.decay > 1e-3]
        self.points.append((n_fed, verify_s, 1.0))
        if n_drafted:
            per_token = draft_s / n_drafted
            self.draft_per_token_s = (per_token if self.draft_per_token_s is None
                                      else 0.7 * self.draft_per_token_s + 0.3 * per_token)

    def costs(self) -> StepCosts | None:
        """The current estimate; None until there is a verify timing and a draft timing (or a prior). Fitted
        once per observation: the loop asks for it several times a step."""
        if self._fitted is not None:
            return self._fitted
        points = list(self.points)
        if self.prior is not None:
            prior = self.prior.verify_table or tuple((n, self.prior.verify_s(n)) for n in (1, self.PRIOR_SPAN))
            points += [(n, t, self.prior_weight) for n, t in prior]
        if not points or self.draft_per_token_s is None:
            return None
        a, b = fit_line([p[0] for p in points], [p[1] for p in points], [p[2] for p in points])
        self._fitted = StepCosts(verify_fixed_s=a, verify_per_token_s=b, draft_per_token_s=self.draft_per_token_s,
                                 verify_table=_curve(points),
                                 catch_up_per_token_s=self.prior.catch_up_per_token_s if self.prior else None)
        return self._fitted


def _curve(points: list[tuple[int, float, float]]) -> tuple[tuple[int, float], ...]:
    """The weighted mean seconds per n, as measured: a wider forward may cost less than a narrower one where a
    kernel changes (llama.cpp's tiled matmul: t(8) above t(16) on some CPUs), and the pricing uses that."""
    sums: dict[int, list[float]] = {}
    for n, t, w in points:
        total = sums.setdefault(n, [0.0, 0.0])
        total[0] += w * t
        total[1] += w
    return tuple((n, sums[n][0] / sums[n][1]) for n in sorted(sums))


def break_even_alpha(costs: StepCosts, k: int, tolerance: float = 1e-4) -> float | None:
    """The per-token acceptance at which drafting k tokens is exactly as fast as target-only decoding; None when
    no acceptance makes it pay (even a perfect draft loses). Speedup grows with alpha: bisection."""
    if costs.speedup(1.0, k) < 1.0:
        return None
    low, high = 0.0, 1.0
    if costs.speedup(low, k) >= 1.0:
        return 0.0
    while high - low > tolerance:
        mid = (low + high) / 2
        low, high = (mid, high) if costs.speedup(mid, k) < 1.0 else (low, mid)
    return high
