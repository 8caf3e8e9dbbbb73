"""Frozen settings. Validation happens here, once, with readable messages."""
from __future__ import annotations

from dataclasses import dataclass

from engine.errors import InvalidSettingError

# int8-dynamic: torch's dynamic int8 Linear layers (fbgemm) on CPU, 3x faster per token than bf16 for a 0.5B
# draft here; bitsandbytes int8/nf4 save memory but run slower than bf16 on CPU.
# auto: the measured fastest for this machine and role (engine.hardware.AUTO_PRECISION).
# int8-weight: int8 weights with bf16 activations (engine/int8_weight.py); unlike int8-dynamic, a token's
# logits do not depend on the other tokens of the forward, so it keeps a target lossless.
AUTO = "auto"
PRECISIONS = (AUTO, "bf16", "fp32", "int8", "nf4", "int8-dynamic", "int8-weight")
MAX_K = 64
MAX_NEW_TOKENS = 8192


def _check(cond: bool, message: str) -> None:
    if not cond:
        raise InvalidSettingError(message)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy. top_k == 0 and top_p == 1 switch those filters off."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 256
    stop_on_eos: bool = True

    def __post_init__(self):
        _check(0.0 <= self.temperature <= 5.0, f"temperature must be in [0, 5], got {self.temperature}")
        _check(0.0 < self.top_p <= 1.0, f"top_p must be in (0, 1], got {self.top_p}")
        _check(self.top_k >= 0, f"top_k must be >= 0 (0 = off), got {self.top_k}")
        _check(1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
               f"max_new_tokens must be in [1, {MAX_NEW_TOKENS}], got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class SpecConfig:
    """How speculation runs. ``k`` is the draft length; ``adaptive`` lets it move between k_min and k_max."""
    k: int = 4
    proposer: str = "draft"
    adaptive: bool = False
    k_min: int = 1
    k_max: int = 16

    def __post_init__(self):
        _check(isinstance(self.k, int) and 1 <= self.k <= MAX_K,
               f"k (draft length) must be an integer in [1, {MAX_K}], got {self.k!r}")
        _check(1 <= self.k_min <= self.k_max <= MAX_K, f"need 1 <= k_min <= k_max <= {MAX_K}")


# What the app does by default: prompt lookup when the text repeats, the draft model otherwise, adaptive k.
DEFAULT_SPEC = SpecConfig(k=4, proposer="hybrid", adaptive=True)


def check_precision(precision: str) -> str:
    _check(precision in PRECISIONS, f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision
