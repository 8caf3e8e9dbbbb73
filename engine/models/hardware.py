"""What machine we run on: its kind, from detected features only.

CUDA, else MPS, else torch's CPU capability (which follows ``ATEN_CPU_CAPABILITY``) and the /proc/cpuinfo flags,
capped by ``ONEDNN_MAX_CPU_ISA`` (oneDNN runs the bf16 matmuls; capped at AVX2 it has no native bf16). What
``auto`` picks on each kind is engine/models/auto.py's.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MACHINE_KINDS = ("cuda", "mps", "amx", "avx512-bf16", "avx512", "avx2", "baseline")

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
