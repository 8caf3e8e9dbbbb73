"""A llama.cpp binary that crashes as its repacked kernels do on some AMX machines (bench/peer/server.py)."""
from pathlib import Path


def crashing_with_repack(real: Path, folder: Path) -> Path:
    """A stand-in for a llama.cpp binary on a machine whose repacked kernels crash (a 2-core AMX VM: llama.cpp's
    AMX GEMM died of SIGILL on a ``tilezero`` at its first forward, docs/bench.md): it kills itself with SIGILL unless
    given --no-repack, else runs the real binary."""
    real = Path(real)
    wrapper = folder / real.name
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" --no-repack "*) exec "{real}" "$@";; esac\nkill -ILL $$\n')
    wrapper.chmod(0o755)
    return wrapper
