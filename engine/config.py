"""Frozen settings. Validation happens here, once, with readable messages; nothing downstream re-checks.

This module imports nothing heavy (no torch): the app and ``launch.py --help`` read the allowed values here.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Integral, Real

from engine.errors import InvalidSettingError
from engine.precision import RECORDS

AUTO = "auto"  # not a precision: the chooser (engine.models.auto.plan_precisions) picks one per role
PRECISIONS = (AUTO, *RECORDS)  # what a precision setting may be (engine/precision.py: what each one is)

MAX_K = 64
MAX_NEW_TOKENS = 8192
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed takes a 64-bit integer
MAX_STOPS = 4  # stop strings a request may give (OpenAI's limit)
MAX_STOP_CHARS = 256  # the longest stop string
MAX_CANDIDATES = 20  # the most likely tokens a TokenEvent may list beside its own (OpenAI's top_logprobs allows 20)
# engine/proposers/__init__.py asserts that its registry has exactly these keys (it says which draft each uses)
PROPOSER_NAMES = ("draft", "fast-draft", "lookup", "hybrid")
# the proposers that need no draft model, so every draft they make is free (engine.decode.draft.Draft.free): the k
# policy has no draft length to size, and a prediction prices their drafts at no draft cost. The registry asserts
# that exactly these build without a draft model
FREE_PROPOSERS = frozenset({"lookup"})
# The longest free draft (known text: a prompt lookup, a prediction, a cached or remembered answer) proposed and priced:
# the widest verify whose cost is measured at load (engine/models/load_checks.py STEP_COST_TOKENS).
FREE_SPAN = 64
# off: no lookup, no store; verify: a similar cached answer becomes the draft; direct: served as is if guards pass
CACHE_MODES = ("off", "verify", "direct")
DEFAULT_CACHE_THRESHOLD = 0.80  # MiniLM: paraphrases sit at 0.81-0.99; unrelated prompts mostly below 0.75


def _check(cond: bool, message: str, setting: str | None = None) -> None:
    if not cond:
        raise InvalidSettingError(message, setting)


def is_int(value) -> bool:
    """An integer that is not a bool (True would pass as 1)."""
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _int_in(name: str, value, low: int, high: int, note: str = "") -> None:
    _check(is_int(value) and low <= value <= high,
           f"{name} must be a whole number in [{low}, {high}]{note}, got {value!r}", name)


def _real(name: str, value, ok, bounds: str) -> None:
    _check(_is_real(value) and ok(value), f"{name} must be a number in {bounds}, got {value!r}", name)


def _bool(name: str, value) -> None:
    _check(isinstance(value, bool), f"{name} must be True or False, got {value!r}", name)


@dataclass(frozen=True)
class SamplingConfig:
    """temperature == 0 means greedy. top_k == 0 and top_p == 1 switch those filters off.

    ``candidates`` asks what the target's distribution said at each position (vLLM's ``logprobs``): None, nothing
    (the default); N, each TokenEvent spells its token (text and bytes) and lists the N most likely tokens
    beside it, with their probabilities (engine.events.Candidates). It changes no token."""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 256
    stop_on_eos: bool = True
    candidates: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self):
        _real("temperature", self.temperature, lambda t: 0.0 <= t <= 5.0, "[0, 5]")
        _real("top_p", self.top_p, lambda p: 0.0 < p <= 1.0, "(0, 1]")
        _int_in("top_k", self.top_k, 0, 2**31 - 1, " (0 = off)")
        if self.seed is not None:
            _int_in("seed", self.seed, 0, MAX_SEED, " or None (random)")
        _int_in("max_new_tokens", self.max_new_tokens, 1, MAX_NEW_TOKENS)
        _bool("stop_on_eos", self.stop_on_eos)
        if self.candidates is not None:
            _int_in("candidates", self.candidates, 0, MAX_CANDIDATES, " or None (off)")
        _check(isinstance(self.stop, tuple) and len(self.stop) <= MAX_STOPS
               and all(isinstance(s, str) and 0 < len(s) <= MAX_STOP_CHARS for s in self.stop),
               f"stop must be a tuple of at most {MAX_STOPS} non-empty strings of at most {MAX_STOP_CHARS} "
               f"characters, got {self.stop!r}", "stop")

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
        _int_in("k (draft length)", self.k, 1, MAX_K)
        _check(self.proposer in PROPOSER_NAMES,
               f"unknown proposer {self.proposer!r}; choose one of {', '.join(PROPOSER_NAMES)}")
        _bool("adaptive", self.adaptive)
        _int_in("k_min", self.k_min, 1, MAX_K)
        _int_in("k_max", self.k_max, 1, MAX_K)
        _check(self.k_min <= self.k_max, f"need k_min <= k_max, got {self.k_min} > {self.k_max}")


@dataclass(frozen=True)
class CacheConfig:
    """How one request uses the semantic cache: ``mode`` (CACHE_MODES) and the similarity ``threshold``."""
    mode: str = "verify"
    threshold: float = DEFAULT_CACHE_THRESHOLD

    def __post_init__(self):
        _check(isinstance(self.mode, str) and self.mode in CACHE_MODES,
               f"cache mode must be one of {', '.join(CACHE_MODES)}, got {self.mode!r}")
        _real("cache threshold", self.threshold, lambda t: 0.0 < t <= 1.0, "(0, 1]")


CACHE_OFF = CacheConfig(mode="off")

# Where the target is bit-identical only up to some verify width: keep an adaptive k within it, or not
# (engine/serve/verify_mode.py prices each)
VERIFY_MODES = ("identical", "fastest")

# The one place the defaults live: the UI's controls, /chat and /v1 all start from these.
DEFAULT_SAMPLING = SamplingConfig()
DEFAULT_CACHE = CacheConfig()

# What the app does by default: prompt lookup when the text repeats, the fast draft otherwise, adaptive k.
DEFAULT_SPEC = SpecConfig(k=4, proposer="hybrid", adaptive=True)


def check_precision(precision: str) -> str:
    _check(precision in PRECISIONS, f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    return precision
