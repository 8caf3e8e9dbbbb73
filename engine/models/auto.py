"""What ``auto`` picks, and why: ``plan_precisions`` decides it, for every device and role, and says why in one
sentence; the UI's pair line, ``launch.py --help``, the bench header and ``/v1/models`` all print that sentence.

The rule, per machine kind (engine/models/hardware.py detects the kind; what it rests on is measured with
``python -m bench.speed.forward``, and the numbers are in docs/models.md):

- A GGUF model (a built-in, a .gguf file) on a CPU runs as ``gguf`` where llama-cpp-python is installed:
  llama.cpp multiplies 8-bit activations by the file's 4-bit blocks in integers, where torch's kernels unpack
  each weight first.
- Otherwise the CPU target is a precision whose rows are expected to be batch-invariant (engine/precision.py),
  so that greedy speculation can be the target's bit for bit: int4 where the CPU has AVX-512 (AMX included),
  since a one-token forward is bound by the weight bytes it reads and 4-bit reads half of int8's; int8-weight
  on AVX2 and older, where torch's int4 kernel unpacks the 4-bit weights in AVX2 registers at a cost that
  outweighs the bytes it saves at one token. Never int8-dynamic: its activation scale is shared by the rows of
  a forward, so a token's logits depend on the other tokens verified with it.
- The CPU draft is int8-dynamic, the cheapest draft token on every CPU kind measured (a draft need not be
  batch-invariant); bf16 where torch has no quantized engine at all.
- On a CUDA GPU the pair is weighed against the free memory (``devices.choose_gpu_precisions``, pure): bf16 for
  both (fp16 without bf16) when the weights fit, else nf4 for what does not fit, the target first.
- On Apple's MPS: bf16 for both, fp16 where MPS has no bf16.

A precision the user chose is kept (and the others fit around it); every precision is checked against the device.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from engine.backends.llama_cpp import GGUF, INSTALL_HINT
from engine.config import AUTO, check_precision
from engine.models import devices, hardware
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.devices import PrecisionPlan
from engine.models.sources import gguf_model, gguf_runnable, resolve_source


@dataclass(frozen=True)
class CpuChoice:
    """What auto picks on one CPU kind for a torch model, and why, in words."""
    target: str
    draft: str
    why: str


_INT4 = CpuChoice("int4", "int8-dynamic", "int4 target: a one-token forward reads every weight, and 4-bit "
                                          "weights are half the bytes of int8")
_INT8_WEIGHT = CpuChoice("int8-weight", "int8-dynamic", "int8-weight target: without AVX-512, torch's int4 kernel "
                                                        "spends more unpacking 4-bit weights than it saves in bytes")
CPU_CHOICES: dict[str, CpuChoice] = {"amx": _INT4, "avx512-bf16": _INT4, "avx512": _INT4,
                                     "avx2": _INT8_WEIGHT, "baseline": _INT8_WEIGHT}
DRAFT_WHY = "int8-dynamic draft: the cheapest draft token"
GGUF_WHY = "gguf: llama.cpp's kernels run the GGUF file (llama-cpp-python is installed)"
NO_GGUF_WHY = ("torch on a CPU, not gguf: llama-cpp-python is not installed, and torch's kernels decode a token about "
               "3x slower than llama.cpp's on the same file (3.5 against 9.5 tok/s for the 1.5B target on a 2-core "
               f"Zen 3, docs/models.md); {INSTALL_HINT} installs the fast path")


def plan_precisions(models: dict[str, tuple[str, str | None]], device: torch.device | None = None,
                    cache_dir: Path | None = None, reclaimable_bytes: int = 0, weigh: bool = True) -> PrecisionPlan:
    """Concrete precisions for ``{role: (name, precision)}`` on ``device`` (``None`` or ``auto``: auto picks),
    refused when the device cannot run them, and the sentence that says what was chosen and why. On a CUDA GPU
    auto weighs the models' sizes against the free memory (plus ``reclaimable_bytes``, the memory of models a
    switch lets go); ``weigh=False`` (``launch.py --help``) reads no model's size and states the rule instead."""
    device = device or devices.default_device()
    fixed = {role: None if precision in (None, AUTO) else check_precision(precision)
             for role, (_, precision) in models.items()}
    machine = hardware.detect_machine(device.type)
    if None not in fixed.values():
        chosen, why = dict(fixed), []
    elif device.type == "cuda":
        chosen, why = _on_gpu(models, fixed, device, cache_dir, reclaimable_bytes, weigh)
    elif device.type == "mps":
        half = devices.half_precision(device)
        chosen = {role: precision or half for role, precision in fixed.items()}
        why = [f"{half}: the 16-bit precision Apple's MPS computes in" if half == "bf16" else
               "fp16: Apple's MPS here has no bf16"]
    else:
        chosen, why = _on_cpu(models, fixed, machine)
    for precision in chosen.values():
        devices.check_device_precision(precision, device)
    return PrecisionPlan(chosen, describe(machine, chosen, {r for r, p in fixed.items() if p is None}, why))


def default_pair_note() -> str:
    """What auto picks here for the default pair, and why (``launch.py --help``): the sentence the pair line shows
    once that pair loads; on a CUDA GPU the rule and the free memory (the models' sizes are weighed at load)."""
    return plan_precisions({"target": (DEFAULT_TARGET, None), "draft": (DEFAULT_DRAFT, None)}, weigh=False).reason


def describe(machine: hardware.Machine, precisions: dict[str, str], auto_roles: set[str], why: list[str]) -> str:
    """E.g. 'AVX2 CPU (no native bf16) [torch AVX2] -> target int8-weight (auto), draft int8-dynamic (chosen)',
    then why auto chose so, after a colon."""
    roles = ", ".join(f"{role} {p} ({'auto' if role in auto_roles else 'chosen'})" for role, p in precisions.items())
    return f"{machine.describe()} -> {roles}" + (f": {'; '.join(why)}" if why else "")


def _on_cpu(models: dict[str, tuple[str, str | None]], fixed: dict[str, str | None],
            machine: hardware.Machine) -> tuple[dict[str, str], list[str]]:
    choice, chosen, why = CPU_CHOICES[machine.kind], {}, []
    for role, precision in fixed.items():
        notes = []
        if precision:
            chosen[role] = precision
        elif gguf_runnable(models[role][0]):
            chosen[role], notes = GGUF, [GGUF_WHY]
        elif role == "target":
            chosen[role], notes = choice.target, [choice.why]
        else:
            ready, note = devices.prepare_quantized_engine()
            chosen[role] = choice.draft if ready else "bf16"
            notes = [DRAFT_WHY, note] if ready else [note]
        why += [n for n in notes if n and n not in why]
    if any(not fixed[r] and chosen[r] != GGUF and gguf_model(name) for r, (name, _) in models.items()):
        why.append(NO_GGUF_WHY)
    return chosen, why


def _on_gpu(models: dict[str, tuple[str, str | None]], fixed: dict[str, str | None], device: torch.device,
            cache_dir: Path | None, reclaimable_bytes: int, weigh: bool) -> tuple[dict[str, str], list[str]]:
    half, where = devices.half_precision(device), devices.gpu_name(device)
    free, _ = devices.gpu_memory(device)
    if not weigh:
        chosen = {role: precision or half for role, precision in fixed.items()}
        return chosen, [f"{half} while the pair's weights fit in {devices.FIT_FRACTION:.0%} of the "
                        f"{devices.gb(free)} free on {where}, else nf4 for what does not fit, the target first "
                        f"(weighed when the pair loads)"]
    sizes = {role: devices.model_size(resolve_source(name, cache_dir)) for role, (name, _) in models.items()}
    plan = devices.choose_gpu_precisions(free + reclaimable_bytes, half, sizes, fixed, where)
    return plan.precisions, [plan.reason]
