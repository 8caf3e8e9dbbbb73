"""A measured verify curve held fixed, so a test asserts the decisions a machine with that curve makes (no clock)."""
from __future__ import annotations

from engine.costs.costmodel import StepCosts
from engine.decode.kpolicy import FixedK

ONE = 0.06  # seconds of a one-token forward
# t(n) in one-token forwards as llama-bench measured it on a 2-core Zen 3 (AVX2): the tiled path's bump at 8 kept
ZEN3 = ((1, 1.0), (2, 1.45), (4, 2.3), (8, 6.7), (16, 6.5), (32, 11.0), (64, 18.0))


def on_curve(points: tuple[tuple[int, float], ...], one: float = ONE) -> StepCosts:
    """Step costs whose verify of n tokens takes t one-token forwards of ``one`` seconds, per (n, t) in ``points``."""
    return StepCosts(verify_fixed_s=one, verify_per_token_s=0.0, draft_per_token_s=0.0,
                     verify_table=tuple((n, t * one) for n, t in points))


CURVE = on_curve(ZEN3)


class OnThisCurve(FixedK):
    """A fixed k (free drafts offered up to k tokens too) with its costs held at CURVE."""

    def __init__(self, k: int):
        super().__init__(k, span=k)

    @property
    def costs(self):
        return CURVE
