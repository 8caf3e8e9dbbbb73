"""The UI's controls -> engine configs. Validation stays in the engine's config constructors (InvalidSettingError);
the defaults are the engine's (engine.config), declared nowhere else."""
from __future__ import annotations

from dataclasses import asdict, dataclass

from engine.config import (CACHE_OFF, DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, CacheConfig, SamplingConfig,
                           SpecConfig)
from engine.errors import InvalidSettingError
from engine.surface import BUILTIN_MODELS


@dataclass(frozen=True)
class UISettings:
    """The decoding and cache controls, as the user left them (Gradio's values: numbers as typed, or None)."""
    proposer: str = DEFAULT_SPEC.proposer  # what the app does by default: hybrid proposer, adaptive k
    k: int | float | None = DEFAULT_SPEC.k
    adaptive: bool = DEFAULT_SPEC.adaptive
    temperature: float = DEFAULT_SAMPLING.temperature
    top_p: float = DEFAULT_SAMPLING.top_p
    max_new_tokens: int | float | None = DEFAULT_SAMPLING.max_new_tokens
    seed: str | None = None  # a text box: blank means a fresh random draw
    cache_enabled: bool = True
    cache_mode: str = DEFAULT_CACHE.mode
    cache_threshold: float = DEFAULT_CACHE.threshold
    show_rejected: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def _as_int(value, name: str):
    """Gradio numbers arrive as typed, int or float (or None); a float that is a whole number becomes that int,
    anything else goes on as it is, for the engine's config to refuse with its own message."""
    if value is None:
        raise InvalidSettingError(f"{name} is empty: enter a number")
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _seed(value) -> int | str | None:
    """The seed box's text: blank is None (a fresh random draw), a whole number is exactly that integer (never
    through a float, which would turn 12345678901234567 into ...568), anything else goes to the engine as typed."""
    text = "" if value is None else str(value).strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        return text


def sampling_config(s: UISettings) -> SamplingConfig:
    seed = _seed(s.seed)
    return SamplingConfig(temperature=float(s.temperature), top_p=float(s.top_p),
                          max_new_tokens=_as_int(s.max_new_tokens, "max new tokens"), seed=seed)


def spec_config(s: UISettings) -> SpecConfig:
    return SpecConfig(k=_as_int(s.k, "k"), proposer=s.proposer, adaptive=bool(s.adaptive))


def cache_config(s: UISettings) -> CacheConfig:
    """The cache controls as the engine's CacheConfig: mode "off" when the box is unticked."""
    if not s.cache_enabled:
        return CACHE_OFF
    return CacheConfig(mode=s.cache_mode, threshold=float(s.cache_threshold))


def model_choices() -> list[str]:
    return list(BUILTIN_MODELS)
