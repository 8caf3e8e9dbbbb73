"""UI values -> engine configs. Validation stays in the engine's config constructors (InvalidSettingError)."""
from __future__ import annotations

import inspect
from dataclasses import asdict, dataclass

from engine.catalog import BUILTIN_MODELS
from engine.config import DEFAULT_SPEC, SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError

CACHE_MODES = ("verify", "direct")


@dataclass(frozen=True)
class UISettings:
    """The decoding and cache controls, as the user left them."""
    proposer: str = DEFAULT_SPEC.proposer  # what the app does by default: hybrid proposer, adaptive k
    k: float | None = DEFAULT_SPEC.k
    adaptive: bool = DEFAULT_SPEC.adaptive
    temperature: float = 0.0
    top_p: float = 1.0
    max_new_tokens: float | None = 256
    seed: str | float | None = None  # a text box: blank means a fresh random draw
    cache_enabled: bool = True
    cache_mode: str = "verify"
    cache_threshold: float = 0.8
    show_rejected: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _as_int(value, name: str):
    """Gradio numbers arrive as floats (or None); keep non-integers as they are so the engine reports them."""
    if value is None:
        raise InvalidSettingError(f"{name} is empty: enter a number")
    return int(value) if float(value).is_integer() else value


def _seed(value) -> int | None:
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    try:
        return int(float(text)) if float(text).is_integer() else _bad_seed(text)
    except ValueError:
        return _bad_seed(text)


def _bad_seed(text: str):
    raise InvalidSettingError(f"seed must be a whole number or blank (random), got {text!r}")


def sampling_config(s: UISettings) -> SamplingConfig:
    seed = _seed(s.seed)
    return SamplingConfig(temperature=float(s.temperature), top_p=float(s.top_p),
                          max_new_tokens=_as_int(s.max_new_tokens, "max new tokens"), seed=seed)


def spec_config(s: UISettings) -> SpecConfig:
    return SpecConfig(k=_as_int(s.k, "k"), proposer=s.proposer, adaptive=bool(s.adaptive))


def supports_cache(engine) -> bool:
    """True when the engine has a semantic cache and ``generate`` takes ``cache_mode``."""
    return getattr(engine, "cache", None) is not None and "cache_mode" in _generate_params(engine)


def _generate_params(engine) -> set[str]:
    try:
        return set(inspect.signature(engine.generate).parameters)
    except (AttributeError, TypeError, ValueError):
        return set()


def cache_options(engine, s: UISettings | None, off: bool = False) -> dict:
    """The keyword arguments that carry the cache settings into ``engine.generate`` (empty without a cache).

    This is the one place the cache controls are wired: ``cache_mode`` ("verify" | "direct" | "off") and
    the similarity threshold, passed under whichever name ``generate`` declares.
    """
    params = _generate_params(engine)
    if "cache_mode" not in params:
        return {}
    enabled = s is not None and s.cache_enabled and not off
    options = {"cache_mode": s.cache_mode if enabled else "off"}
    for name in ("cache_threshold", "threshold", "similarity_threshold"):
        if name in params and s is not None:
            options[name] = float(s.cache_threshold)
            break
    return options


def proposer_names() -> list[str]:
    """Keys of ``engine.proposers.PROPOSERS``. Imported here, not at module import: it pulls in torch."""
    try:
        from engine.proposers import PROPOSERS
    except ImportError:
        return ["draft"]
    return list(PROPOSERS)


def model_choices() -> list[str]:
    return list(BUILTIN_MODELS)
