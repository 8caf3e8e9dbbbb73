"""app/tabs/controls.py: the decoding and cache controls, as Gradio preprocesses them, into UISettings."""
import gradio as gr
import pytest

from app.settings import UISettings, sampling_config, spec_config
from app.tabs.controls import create, create_cache_controls, create_decoding_panel, view_classes
from engine.config import DEFAULT_CACHE, SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.surface import CacheInfo


def test_the_ui_passes_numbers_as_typed_and_the_engine_refuses_what_is_not_whole():
    """What the browser sends goes through each control's own preprocessing (as Gradio does), then to the engine's
    configs: no rounding on the way, so the engine's message is what the user reads."""
    with gr.Blocks():
        panel = create_decoding_panel()
    seed = panel.seed.preprocess(" 12345678901234567 ")
    assert sampling_config(UISettings(seed=seed)).seed == 12345678901234567  # not ...568 (through a float)
    assert spec_config(UISettings(k=panel.k.preprocess(16))).k == 16
    assert sampling_config(UISettings(max_new_tokens=panel.max_new_tokens.preprocess(16.0))).max_new_tokens == 16
    for field, typed, engine_check in [("k", 2.5, lambda: SpecConfig(k=2.5)),
                                       ("max_new_tokens", 3.5, lambda: SamplingConfig(max_new_tokens=3.5)),
                                       ("seed", "1.5", lambda: SamplingConfig(seed="1.5"))]:
        settings = UISettings(**{field: getattr(panel, field).preprocess(typed)})
        with pytest.raises(InvalidSettingError) as ui_error:
            (spec_config if field == "k" else sampling_config)(settings)
        with pytest.raises(InvalidSettingError) as engine_error:
            engine_check()
        assert str(ui_error.value) == str(engine_error.value)


def test_cache_controls_start_from_the_engine_cache_settings():
    with gr.Blocks():
        on = create_cache_controls(CacheInfo(available=True, threshold=0.9))
        off = create_cache_controls(CacheInfo(available=False))
    assert on.cache_threshold.value == 0.9 and on.cache_enabled.value is True
    assert on.cache_mode.value == DEFAULT_CACHE.mode
    assert off.cache_enabled.value is False and off.cache_enabled.interactive is False
    assert off.cache_threshold.value == DEFAULT_CACHE.threshold


def test_the_controls_are_read_as_one_uisettings_by_their_field_names():
    with gr.Blocks():
        controls = create(CacheInfo(available=True, threshold=0.9))
    named = controls.settings_fields()
    assert list(named) == list(UISettings.__dataclass_fields__)
    assert named["k"] is controls.decoding.k and named["cache_mode"] is controls.cache.cache_mode
    chosen = UISettings(k=7, seed="5", temperature=0.5, cache_enabled=False, cache_threshold=0.8)
    assert controls.read({named[name]: value for name, value in chosen.to_dict().items()}) == chosen


def test_the_view_switches_add_classes_to_each_view_s_own():
    assert view_classes(["race-answer"], True, "rendered") == ["race-answer"]
    assert view_classes(["race-answer"], False, "tokens") == ["race-answer", "hide-rejected", "view-tokens"]
    assert view_classes([], True, "tokens") == ["view-tokens"]
