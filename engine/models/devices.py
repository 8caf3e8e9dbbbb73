"""Where the models run (a CUDA GPU, Apple's MPS, the CPU), what that device can do, and what it refuses.

The probes (free GPU memory, bf16 support, torch's quantized engine) are small functions, so tests monkeypatch
them; the choices are pure functions of what the probes return (``choose_gpu_precisions``: what ``auto`` picks on a
CUDA GPU, called by engine.models.auto.plan_precisions). What each precision runs on, and whether it can be the
target, is its record's (engine/precision.py); the refusals here read it:

- ``check_device_precision``: a precision on a device it does not run on (the CPU's kernels elsewhere,
  bitsandbytes on MPS), and int8-dynamic where torch has no quantized engine.
- ``check_target_precision``: a precision that cannot be the target of a lossless loop (LLM.int8).
"""
from __future__ import annotations

import gc
import importlib.util
import itertools
from dataclasses import dataclass

import torch

from engine.errors import DeviceOutOfMemoryError, InvalidSettingError, MissingDependencyError
from engine.precision import CPU_ONLY, LLAMA_CPP, precision as record

FIT_FRACTION = 0.7  # bf16 weights may take this share of the free GPU memory
DEVICE_LABELS = {"cuda": "a CUDA GPU", "mps": "Apple's MPS", "cpu": "the CPU"}


def default_device() -> torch.device:
    """A CUDA GPU, else Apple's MPS, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    if mps_available():
        return torch.device("mps")
    return torch.device("cpu")


def mps_available() -> bool:
    mps = getattr(torch.backends, "mps", None)
    return bool(mps is not None and mps.is_available())


def bf16_supported(device: torch.device) -> bool:
    """Whether ``device`` computes in bf16 (CUDA: Ampere and later; MPS: macOS 14 and later)."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type == "mps":
        try:
            torch.ones(1, dtype=torch.bfloat16, device=device)
        except (RuntimeError, TypeError):
            return False
    return True


def half_precision(device: torch.device) -> str:
    """The 16-bit precision this device computes in: bf16, or fp16 where it has no bf16."""
    return "bf16" if bf16_supported(device) else "fp16"


def gpu_memory(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of a CUDA device."""
    free, total = torch.cuda.mem_get_info(device)
    return int(free), int(total)


def gpu_name(device: torch.device) -> str:
    return str(torch.cuda.get_device_name(device))


def prepare_quantized_engine() -> tuple[bool, str]:
    """(whether int8-dynamic can run, what was done about it). macOS wheels set torch's quantized engine to
    ``none``, where ``quantize_dynamic`` raises NoQEngine; qnnpack is chosen when this build has it."""
    qengine = torch.backends.quantized
    if qengine.engine != "none":
        return True, ""
    if "qnnpack" in qengine.supported_engines:
        qengine.engine = "qnnpack"
        return True, "torch's quantized engine was 'none': int8-dynamic runs on qnnpack"
    return False, "this torch has no quantized engine (not even qnnpack): no int8-dynamic draft, bf16 instead"


def check_device_precision(precision: str, device: torch.device) -> None:
    """Refuse a precision the device cannot run, with what to choose instead."""
    p = record(precision)
    if device.type not in p.devices and p.devices == CPU_ONLY:
        instead = "bf16 or nf4 (bitsandbytes)" if device.type == "cuda" else "bf16 or fp16"
        kernels = "llama.cpp built for the CPU" if p.backend == LLAMA_CPP else "torch's CPU kernels"
        raise InvalidSettingError(f"{precision} runs on the CPU only ({kernels}); on "
                                  f"{DEVICE_LABELS[device.type]} use {instead}")
    if device.type not in p.devices:
        raise InvalidSettingError(f"{precision} ({p.package or p.backend}) does not run on "
                                  f"{DEVICE_LABELS[device.type]}; use bf16 or fp16")
    if precision == "int8-dynamic" and device.type == "cpu" and not prepare_quantized_engine()[0]:
        raise InvalidSettingError("int8-dynamic needs one of torch's quantized engines, and this torch build has "
                                  "none (torch.backends.quantized.engine is 'none', no qnnpack); choose bf16")


def check_target_precision(precision: str) -> None:
    p = record(precision)
    if p.cannot_target:
        raise InvalidSettingError(f"{precision} ({p.about}) cannot be the target: {p.cannot_target}; choose "
                                  f"another precision for the target ({precision} is fine for the draft)")


def require_bitsandbytes(precision: str) -> None:
    """Refuse a bitsandbytes precision (its record's package) when bitsandbytes is not installed."""
    p = record(precision)
    if p.package == "bitsandbytes" and importlib.util.find_spec(p.module) is None:
        raise MissingDependencyError(
            f"{precision} needs the bitsandbytes package, which is not installed (it installs with speclens on "
            f"Linux and Windows only): `pip install bitsandbytes`, or choose bf16")


@dataclass(frozen=True)
class ModelSize:
    params: int  # every parameter (tied ones once)
    linear_params: int  # the weights of the decoder's Linear layers, which are quantised (the output head excluded)

    def bytes(self, precision: str) -> int:
        """The weights' bytes in ``precision`` (its record's bytes per weight), the KV cache aside."""
        return int(record(precision).weight_bytes(self.linear_params, self.params - self.linear_params))


def model_size(source: str) -> ModelSize:
    """The size of the model in ``source`` from its config alone: no weights read."""
    from transformers import AutoConfig

    return config_size(AutoConfig.from_pretrained(source))


def config_size(config) -> ModelSize:
    """The size of a model with this config, counted on an empty (meta) copy: the loaded one may be quantised."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    head = model.get_output_embeddings()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear) and m is not head)
    return ModelSize(params=sum(p.numel() for p in model.parameters()), linear_params=linear)


def gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:.1f} GB"


@dataclass(frozen=True)
class PrecisionPlan:
    precisions: dict[str, str]  # role -> concrete precision
    reason: str = ""  # why: from plan_precisions, the one sentence every place that says what auto chose prints


def choose_gpu_precisions(free_bytes: int, half: str, sizes: dict[str, ModelSize], fixed: dict[str, str | None],
                          where: str = "the GPU") -> PrecisionPlan:
    """Pure: for each role whose ``fixed`` precision is None, ``half`` (bf16/fp16) if everything fits in
    FIT_FRACTION of ``free_bytes``, else nf4 for what does not fit, the first role (the target) first."""
    roles = list(sizes)
    options = [[fixed[r]] if fixed.get(r) else [half, "nf4"] for r in roles]
    # fewest nf4 first; among equals the later roles (the draft) keep the 16-bit weights longest
    candidates = sorted(itertools.product(*options),
                        key=lambda c: (c.count("nf4"), [p == "nf4" for p in reversed(c)]))
    budget = FIT_FRACTION * free_bytes

    def need(choice) -> int:
        return sum(sizes[r].bytes(p) for r, p in zip(roles, choice))

    fitting = next((c for c in candidates if need(c) <= budget), None)
    choice = fitting or candidates[-1]
    picked = ", ".join(f"{r} {p}" for r, p in zip(roles, choice))
    room = f"{int(FIT_FRACTION * 100)}% of the {gb(free_bytes)} free on {where}"
    if fitting is None:
        reason = f"even {picked} ({gb(need(choice))}) needs more than {room}: loading may run out of memory"
    elif fitting == candidates[0]:
        reason = f"the weights ({gb(need(choice))}) fit in {room}"
    else:
        reason = (f"in {half} the weights ({gb(need(candidates[0]))}) need more than {room}; "
                  f"{picked} take {gb(need(choice))}")
    if half == "fp16":
        reason += "; fp16: this GPU has no bf16"
    return PrecisionPlan(dict(zip(roles, choice)), reason)


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or MPS's RuntimeError 'MPS backend out of memory'."""
    return isinstance(err, torch.cuda.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and "out of memory" in str(err).lower())


def gpu_bytes(loaded: list) -> int:
    """GPU memory held by the weights of ``loaded`` (LoadedModels; a model shared by two roles counts once)."""
    backends = {m.backend for m in loaded if m.device.type == "cuda"}  # equal for the same model
    return sum(backend.weight_bytes() for backend in backends)


GENERATION_INSTEAD = "Ask for fewer new tokens or a shorter prompt, or load the pair in nf4 to leave more room."


def out_of_memory(what: str, loaded: list, device: torch.device | None = None,
                  instead: str = GENERATION_INSTEAD) -> DeviceOutOfMemoryError:
    """The typed error for an out-of-memory ``what`` (e.g. 'while generating'). ``loaded``: LoadedModels, or
    (description, bytes) for a model that did not load; ``instead`` says what to choose."""
    device = device or loaded[0].device
    release_memory(device)
    sizes = ", ".join(f"{m[0]} {gb(m[1])}" if isinstance(m, tuple) else
                      f"{m.name} ({m.precision}) {gb(m.backend.weight_bytes())}" for m in loaded)
    free = ""
    if device.type == "cuda":
        free_bytes, total = gpu_memory(device)
        free = f"; {gb(free_bytes)} of {gb(total)} free now"
    return DeviceOutOfMemoryError(f"{DEVICE_LABELS[device.type]} ran out of memory {what} (weights: {sizes}{free}). "
                                  f"{instead}")


def release_memory(device: torch.device | None = None) -> None:
    """Collect what is no longer referenced and hand the device's cached blocks back."""
    gc.collect()
    if device is not None and device.type == "cuda":
        torch.cuda.empty_cache()
    elif device is not None and device.type == "mps":
        torch.mps.empty_cache()
