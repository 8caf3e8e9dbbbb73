"""One record per precision (engine/precision.py), and every place that needs a precision's fact reads it there: the
loader's dtype, the device refusals, the target refusal, the weights' bytes (the CUDA plan, the pair doctor), the
rounding step and the tie rule."""
from __future__ import annotations

import sys

import pytest
import torch

from engine.config import AUTO, PRECISIONS, check_precision
from engine.errors import InvalidSettingError, MissingDependencyError
from engine.models import devices, sources
from engine.models.devices import ModelSize, check_device_precision, check_target_precision
from engine.models.loading import _quantization_kwargs
from engine.precision import LLAMA_CPP, RECORDS, TORCH, overview, precision, rounding_step, tie_margin

DEVICE_TYPES = ("cpu", "cuda", "mps")


def test_every_precision_setting_but_auto_has_a_record_and_auto_has_none():
    assert PRECISIONS == (AUTO, *RECORDS)
    assert all(name == record.name for name, record in RECORDS.items())
    assert set(RECORDS) == {"bf16", "fp16", "fp32", "int8", "nf4", "int8-dynamic", "int8-weight", "int4", "gguf"}
    for name in PRECISIONS:
        assert check_precision(name) == name
    with pytest.raises(InvalidSettingError, match="unknown precision 'auto'"):
        precision(AUTO)  # the chooser, not a precision: engine.models.auto.plan_precisions resolves it first


@pytest.mark.parametrize("name", RECORDS)
def test_the_rounding_step_and_the_tie_margin_come_from_the_record(name):
    record = precision(name)
    assert rounding_step(name, 20.0) == record.rounding_step(20.0) == 2.0 ** (4 - record.mantissa_bits)  # 16<=20<32
    assert rounding_step(name, -3.0) == 2.0 ** (1 - record.mantissa_bits)
    assert tie_margin(name, 20.0) == record.tie_steps * record.rounding_step(20.0) > 0


@pytest.mark.parametrize("name", RECORDS)
def test_the_devices_a_precision_runs_on_are_its_records(name):
    record = precision(name)
    for device_type in DEVICE_TYPES:
        device = torch.device(device_type)
        if device_type in record.devices:
            check_device_precision(name, device)
        else:
            with pytest.raises(InvalidSettingError, match=name):
                check_device_precision(name, device)


@pytest.mark.parametrize("name", RECORDS)
def test_only_a_record_that_says_why_is_refused_as_the_target(name):
    record = precision(name)
    if record.cannot_target:
        with pytest.raises(InvalidSettingError, match="cannot be the target") as err:
            check_target_precision(name)
        assert record.cannot_target in str(err.value)
    else:
        check_target_precision(name)
    assert [p.name for p in RECORDS.values() if p.cannot_target] == ["int8"]  # LLM.int8's outliers span the batch


@pytest.mark.parametrize("name", [p.name for p in RECORDS.values() if p.backend == TORCH])
def test_the_torch_loader_takes_the_records_dtype(name):
    kwargs = _quantization_kwargs(name, torch.device("cpu"))
    assert kwargs["dtype"] == getattr(torch, precision(name).dtype)


def test_what_a_precision_needs_installed_is_its_records(monkeypatch):
    needs = {p.name: (p.package, p.backend) for p in RECORDS.values() if p.package}
    assert needs == {"int8": ("bitsandbytes", TORCH), "nf4": ("bitsandbytes", TORCH),
                     "gguf": ("llama-cpp-python", LLAMA_CPP)}
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)
    for name in ("int8", "nf4"):
        with pytest.raises(MissingDependencyError, match="pip install bitsandbytes"):
            devices.require_bitsandbytes(name)
    devices.require_bitsandbytes("bf16")  # needs nothing
    monkeypatch.setattr(sources, "llama_cpp_available", lambda: False)
    assert sources.gguf_model("smollm2-135m-instruct") and not sources.gguf_runnable("smollm2-135m-instruct")


@pytest.mark.parametrize("name", RECORDS)
def test_a_models_bytes_are_the_records_bytes_per_weight(name):
    size = ModelSize(params=1_000_000, linear_params=800_000)
    record = precision(name)
    assert size.bytes(name) == int(800_000 * record.linear_bytes + 200_000 * record.other_bytes)


def test_bytes_per_weight_order_and_the_scales_they_include():
    b = {name: precision(name).linear_bytes for name in RECORDS}
    assert b["fp32"] > b["bf16"] == b["fp16"] > b["int8-weight"] == b["int8"] > b["int4"] > b["nf4"] > 0.5
    assert b["nf4"] == 0.5 + 4 / 64  # one fp32 absmax per 64 weights
    assert b["int4"] == 0.5 + 2 * 2 / 32  # a bf16 scale and zero per group of 32
    assert 0.5 < b["gguf"] < b["int8-weight"]


def test_the_doctors_memory_covers_every_precision_from_the_records():
    """It had its own table, without int4 or gguf (the CPU's auto choices): now every record, the same bytes."""
    from engine.lab.doctor import memory_gb
    from engine.models.devices import config_size
    from tests.helpers.tiny import tiny_pair

    target, _ = tiny_pair(0)
    memory = memory_gb(target)
    size = config_size(target.config)
    assert set(memory) == set(RECORDS)
    assert all(memory[name] == size.bytes(name) / 1e9 for name in RECORDS)
    assert 0 < memory["int4"] < memory["int8-weight"] < memory["bf16"] and 0 < memory["gguf"] < memory["bf16"]


def test_the_help_overview_is_built_from_the_records():
    text = overview()
    assert all(name in text for name in RECORDS) and "gguf (llama.cpp on CPU; needs llama-cpp-python)" in text
    assert "int8 cannot be the target" in text


def test_the_judges_calibrations_are_keyed_by_precisions_that_have_a_record():
    """The judge's thresholds are measured per (model, precision), not facts of a precision; their keys still name
    records, so a renamed precision cannot leave a calibration behind."""
    from engine.cache.judge import CANNOT_JUDGE, YES_THRESHOLDS

    assert {p for _, p in (*YES_THRESHOLDS, *CANNOT_JUDGE)} <= set(RECORDS)
