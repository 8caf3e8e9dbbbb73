"""What a precision is: one frozen record per precision, the one place its facts live.

Every other module reads these records (the loader's dtype, the device refusals, the memory estimates, the rounding
step and the tie rule, the help text); none restates a fact per precision name. ``auto`` is not a record: it is the
chooser (engine.models.auto.plan_precisions), and it only ever picks one of these.

This module imports nothing heavy (no torch): the dtype is a name, which the torch loader resolves.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engine.errors import InvalidSettingError

TORCH, LLAMA_CPP = "torch", "llama.cpp"  # the backends that load a precision (engine/backends/)
ANY_DEVICE = ("cpu", "cuda", "mps")
CPU_ONLY = ("cpu",)
# Batch invariance: whether a verify row equals the same token fed alone. It is a hint, never a promise: whether it
# holds on this machine is measured when a pair loads (engine/decode/identity.py, PairInfo.bit_identical), and
# tests/backends/test_invariance.py checks it at the shipped models' sizes. What the kernels lead one to expect:
EXPECTED = "expected"  # each output row is computed from its own input row (with row-exact attention on the CPU,
#                        engine/models/attention.py): every verify row can equal the token alone
DIFFERS = "differs"  # the kernels block by the row count, or share a scale across the rows: equal up to rounding ties
UNKNOWN = "unknown"  # depends on the runtime's build and settings: nothing expected, only the measurement
# The one tie rule: a gap of up to ``tie_steps`` rounding steps of the top logit is a tie (an argmax that may flip
# between a token scored alone and inside a verify forward). Each bound is about twice the drift measured between
# the two (docs/models.md); tests/backends/test_invariance.py checks that it holds on the machine at hand.
DEFAULT_TIE_STEPS = 8


@dataclass(frozen=True)
class Precision:
    name: str
    about: str  # what it is, in a few words
    dtype: str | None  # the torch dtype the weights load (and compute) in; None: not loaded by torch
    mantissa_bits: int  # explicit mantissa bits of the numbers the logits are computed in
    linear_bytes: float  # bytes per weight of the decoder's Linear layers, scales and offsets included
    other_bytes: float  # bytes per weight of every other parameter (embeddings, norms, the output head)
    devices: tuple[str, ...]  # the device types it runs on
    backend: str = TORCH  # which backend loads it
    package: str = ""  # what it needs installed beyond the base install (its pip name), and its import name
    module: str = ""
    cannot_target: str = ""  # why it cannot be the target of a lossless loop; '': it can
    batch_invariance: str = DIFFERS  # EXPECTED, DIFFERS or UNKNOWN; whether it holds is measured at load
    tie_steps: int = DEFAULT_TIE_STEPS  # a gap of up to this many rounding steps of the top logit is a tie

    def rounding_step(self, value: float) -> float:
        """Spacing of representable numbers near ``value`` (bf16 near 20: 0.125)."""
        exponent = math.floor(math.log2(abs(value))) if value else 0
        return 2.0 ** (exponent - self.mantissa_bits)

    def weight_bytes(self, linear_params: int, other_params: int) -> float:
        """The weights' bytes of a model with this many Linear-layer and other parameters (the KV cache aside)."""
        return linear_params * self.linear_bytes + other_params * self.other_bytes


_BNB = dict(devices=("cpu", "cuda"), package="bitsandbytes", module="bitsandbytes")
# bitsandbytes, int8-weight and int4 compute in bf16; int8-dynamic quantises the activations to 8 bits, at least as
# coarse as bf16; llama.cpp sums 8-bit activations times 4-bit weights in fp32, coarser than bf16 as well.
RECORDS: dict[str, Precision] = {p.name: p for p in (
    Precision("bf16", "16-bit brain float", "bfloat16", 7, 2, 2, ANY_DEVICE),
    Precision("fp16", "16-bit float", "float16", 10, 2, 2, ANY_DEVICE),
    # fp32 gets more steps: its logits are spaced 2^16 times finer than bf16's, the accumulated GEMM error is not
    Precision("fp32", "32-bit float", "float32", 23, 4, 4, ANY_DEVICE, tie_steps=64),
    Precision("int8", "bitsandbytes LLM.int8", "bfloat16", 7, 1, 2, **_BNB,
              cannot_target="it picks its outlier columns across all the tokens of a forward, so a token's logits "
                            "depend on the other tokens verified with it and the speculative answer would not be "
                            "the target-only one"),
    # 4-bit codes plus one fp32 absmax per 64-weight block
    Precision("nf4", "bitsandbytes 4-bit NormalFloat", "bfloat16", 7, 0.5 + 4 / 64, 2, **_BNB),
    # loaded in fp32; the Linear layers become int8 with one activation scale per forward, shared by its rows
    Precision("int8-dynamic", "torch's dynamic int8 Linear layers", "float32", 7, 1, 4, CPU_ONLY),
    # one bf16 scale per output row (engine/models/int8_weight.py)
    Precision("int8-weight", "int8 weights, bf16 activations", "bfloat16", 7, 1, 2, CPU_ONLY,
              batch_invariance=EXPECTED),
    # a bf16 scale and zero per group of 32 weights (engine/models/int4_weight.py)
    Precision("int4", "4-bit weights in groups of 32, bf16 activations", "bfloat16", 7, 0.5 + 4 / 32, 2, CPU_ONLY,
              batch_invariance=EXPECTED),
    # the file's own mix of formats; the estimate counts every weight as Q4_K (144 bytes per 256 weights)
    Precision("gguf", "the GGUF file's own quantisation, run by llama.cpp", None, 7, 144 / 256, 144 / 256, CPU_ONLY,
              backend=LLAMA_CPP, package="llama-cpp-python", module="llama_cpp", batch_invariance=UNKNOWN,
              tie_steps=16),
)}


def precision(name: str) -> Precision:
    """The record of a concrete precision; an unknown name (``auto`` included) is refused with the choices."""
    found = RECORDS.get(name)
    if found is None:
        raise InvalidSettingError(f"unknown precision {name!r}; choose one of {', '.join(RECORDS)}")
    return found


def rounding_step(name: str, value: float) -> float:
    """Spacing of representable numbers near ``value`` in precision ``name`` (bf16 near 20: 0.125)."""
    return precision(name).rounding_step(value)


def tie_margin(name: str, top_logit: float) -> float:
    """The largest gap below ``top_logit`` that is still a rounding tie in precision ``name``: the one tie rule,
    for every precision and every use (a divergence's explanation, the exact-hit check, the load-time check)."""
    record = precision(name)
    return record.tie_steps * record.rounding_step(top_logit)


_DEVICE_NAMES = {"cpu": "CPU", "cuda": "CUDA", "mps": "MPS"}


def overview() -> str:
    """Every precision in one sentence, grouped by backend, devices and what it needs (``launch.py --help``)."""
    groups: dict[tuple, list[str]] = {}
    for p in RECORDS.values():
        groups.setdefault((p.backend, p.devices, p.package), []).append(p.name)
    parts = [f"{', '.join(names)} ({backend} on {', '.join(_DEVICE_NAMES[d] for d in devices)}"
             + (f"; needs {package})" if package else ")") for (backend, devices, package), names in groups.items()]
    refused = [f"{p.name} cannot be the target" for p in RECORDS.values() if p.cannot_target]
    return "; ".join(parts) + (f". {'; '.join(refused)}" if refused else "")
