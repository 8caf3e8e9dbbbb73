"""What machine we run on, and the precision ``auto`` picks for it.

The kind comes from detected features only: CUDA, else MPS, else torch's CPU capability (which follows
``ATEN_CPU_CAPABILITY``) and the /proc/cpuinfo flags, capped by ``ONEDNN_MAX_CPU_ISA`` (oneDNN runs the bf16
matmuls; capped at AVX2 it has no native bf16). ``AUTO_PRECISION`` holds the measured choice per kind
(``python -m bench.speed.forward``; numbers in docs/models.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MACHINE_KINDS = ("cuda", "mps", "amx", "avx512-bf16", "avx512", "avx2", "baseline")
ROLES = ("target", "draft")

# (target, draft) per machine kind (python -m bench.speed.forward, numbers in docs/models.md):
# - The target is never int8-dynamic: its per-forward activation scale makes a token's logits depend on the
#   other tokens of the verify forward, so the loop would not be lossless (engine/models/int8_weight.py).
# - Every CPU target is chosen batch-invariant where the kernels allow (int4 or int8-weight with row-exact
#   attention, engine/models/attention.py); the load-time check measures whether it is (engine/decode/identity.py).
#   Native bf16 is not (oneDNN's bf16 GEMM rounds by row count).
# - avx512-bf16 (Zen 4), avx512: int4, the GGUF's own 4-bit grid (engine/models/int4_weight.py): decoding reads
#   the weights' bytes, and 4-bit reads about half of int8 (measured 1.5B forward at n = 1/4/16 on Zen 4:
#   int4 34/50/182 ms, int8-weight 64/65/237 ms, bf16 161/140/192 ms).
# - amx: int4 as well. No AMX machine here to measure; AMX speeds the compute, and a one-token forward is bound
#   by the bytes read (oneDNN's bf16 brgemm also repacks each weight per call at n = 1: 161 ms natively above),
#   and int4 keeps the output bit-identical where bf16 cannot.
# - avx2, baseline (no AVX-512): int8-weight. torch's int4 kernel unpacks nibbles in AVX2 registers: measured
#   under the AVX2 emulation at n = 1 int8-weight 73 ms, int4 89 ms (int4 only wins from n = 4 on).
# - The draft: dynamic int8 is the cheapest draft token on every CPU measured; lossless does not need it exact.
# - cuda: bf16 for both when the pair fits comfortably in free GPU memory, else nf4 (bitsandbytes) for what does
#   not fit, fp16 without bf16 (engine/models/devices.py decides from the memory at load time).
# - mps (Apple Silicon): bf16 for both (fp16 where MPS has no bf16); never int8-dynamic or nf4.
AUTO_PRECISION: dict[str, tuple[str, str]] = {
    "cuda": ("bf16", "bf16"),
    "mps": ("bf16", "bf16"),
    "amx": ("int4", "int8-dynamic"),
    "avx512-bf16": ("int4", "int8-dynamic"),
    "avx512": ("int4", "int8-dynamic"),
    "avx2": ("int8-weight", "int8-dynamic"),
    "baseline": ("int8-weight", "int8-dynamic"),
}

_KIND_LABELS = {"cuda": "CUDA GPU", "amx": "AMX CPU", "avx512-bf16": "AVX-512 BF16 CPU (no AMX)",
                "avx512": "AVX-512 CPU (no native bf16)", "avx2": "AVX2 CPU (no native bf16)",
                "baseline": "CPU without AVX2", "mps": "Apple GPU (MPS)"}
_ISA_RANK = ("SSE41", "AVX", "AVX2", "AVX512", "AMX")  # coarse order of ONEDNN_MAX_CPU_ISA values


@dataclass(frozen=True)
class Machine:
    kind: str  # one of MACHINE_KINDS
    features: tuple[str, ...]  # what the kind was decided from, for the message

    def describe(self) -> str:
        return f"{_KIND_LABELS[self.kind]} [{', '.join(self.features)}]"


def _isa_rank(value: str) -> int:
    """Rank of an ONEDNN_MAX_CPU_ISA value (AVX2_VNNI -> AVX2, AVX512_CORE_BF16 -> AVX512); unset/ALL = top."""
    value = value.upper()
    if not value or value in ("ALL", "DEFAULT"):
        return len(_ISA_RANK)
    if "AMX" in value:
        return _ISA_RANK.index("AMX")
    return max((i for i, name in enumerate(_ISA_RANK) if value.startswith(name)), default=0)


def classify(cuda: bool, capability: str, flags: frozenset[str], onednn_isa: str = "", mps: bool = False) -> Machine:
    """The machine kind from its features (pure: tested with made-up inputs)."""
    if cuda:
        return Machine("cuda", ("cuda",))
    if mps:
        return Machine("mps", ("mps",))
    capability = capability.upper()
    isa = _isa_rank(onednn_isa)
    seen = [f"torch {capability}"] + ([f"ONEDNN_MAX_CPU_ISA={onednn_isa}"] if onednn_isa else [])
    if capability.startswith("AVX512") and isa >= _ISA_RANK.index("AVX512"):
        if "amx_bf16" in flags and isa >= _ISA_RANK.index("AMX"):
            return Machine("amx", (*seen, "amx_bf16"))
        if "avx512_bf16" in flags:
            return Machine("avx512-bf16", (*seen, "avx512_bf16", *(["avx512_vnni"] if "avx512_vnni" in flags
                                                                    else [])))
        return Machine("avx512", (*seen, *(["avx512_vnni"] if "avx512_vnni" in flags else [])))
    if capability.startswith("AVX"):  # AVX2, or AVX-512 capped by ONEDNN_MAX_CPU_ISA
        return Machine("avx2", tuple(seen))
    return Machine("baseline", tuple(seen))


def cpu_flags(path: str = "/proc/cpuinfo") -> frozenset[str]:
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def detect_machine(device_type: str | None = None) -> Machine:
    """This machine; ``device_type`` ("cpu" / "cuda" / "mps") says where the models run (default: CUDA if present,
    else MPS if present, else the CPU)."""
    import torch

    if device_type is None:
        from engine.models.devices import default_device
        device_type = default_device().type
    return classify(device_type == "cuda", torch.backends.cpu.get_cpu_capability(), cpu_flags(),
                    os.environ.get("ONEDNN_MAX_CPU_ISA", ""), mps=device_type == "mps")


def auto_precision(machine: Machine, role: str) -> str:
    return AUTO_PRECISION[machine.kind][ROLES.index(role)]


def describe_choice(machine: Machine, target_precision: str, draft_precision: str,
                    chosen: tuple[bool, bool] = (True, True), reason: str = "") -> str:
    """E.g. 'AVX2 CPU (no native bf16) -> target int8-dynamic (auto), draft int8-dynamic (auto)', then ``reason``
    (why auto chose so on this device) after a colon."""
    def part(role: str, precision: str, auto: bool) -> str:
        return f"{role} {precision} ({'auto' if auto else 'chosen'})"
    return (f"{_KIND_LABELS[machine.kind]} -> {part('target', target_precision, chosen[0])}, "
            f"{part('draft', draft_precision, chosen[1])}" + (f": {reason}" if reason else ""))
