"""app/settings.py: the controls' values become the engine's configs, validated and defaulted there only."""
import inspect

import pytest

from app.api.gradio_chat import make_chat_api
from app.context import AppContext
from app.settings import UISettings, cache_config, sampling_config, spec_config
from engine.config import CACHE_OFF, DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, CacheConfig, SamplingConfig
from engine.errors import InvalidSettingError
from tests.helpers.fakes import FakeEngine


def test_settings_validation_comes_from_the_engine_configs():
    with pytest.raises(InvalidSettingError):
        spec_config(UISettings(k=0))
    with pytest.raises(InvalidSettingError):
        spec_config(UISettings(k=None))
    assert sampling_config(UISettings(seed=" 3 ", max_new_tokens=16.0)).seed == 3
    assert sampling_config(UISettings(seed="")).seed is None
    with pytest.raises(InvalidSettingError):
        sampling_config(UISettings(seed="abc"))


def test_defaults_are_the_engine_configs():
    """One place: the UI's controls, /chat and /v1 start from engine.config's defaults."""
    s = UISettings()
    assert sampling_config(s) == SamplingConfig(seed=None) == DEFAULT_SAMPLING
    assert spec_config(s) == DEFAULT_SPEC and cache_config(s) == DEFAULT_CACHE
    params = inspect.signature(make_chat_api(AppContext(FakeEngine([])))).parameters
    assert params["max_new_tokens"].default == DEFAULT_SAMPLING.max_new_tokens
    assert params["temperature"].default == DEFAULT_SAMPLING.temperature and params["k"].default == DEFAULT_SPEC.k


def test_cache_controls_become_one_cache_config():
    assert cache_config(UISettings(cache_mode="direct", cache_threshold=0.85)) == CacheConfig("direct", 0.85)
    assert cache_config(UISettings(cache_enabled=False)) == CACHE_OFF
    with pytest.raises(InvalidSettingError, match="cache mode"):
        cache_config(UISettings(cache_mode="sometimes"))
