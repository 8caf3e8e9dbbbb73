"""Load a GGUF file and print whether this process maps it.

``python -m tests.helpers.mapped_after_load PATH on|off`` (tests/backends/test_gguf_runner.py): the file loaded by
llama.cpp with repacked weights on or off, in a process of its own, so no other model's mapping counts.
"""
from __future__ import annotations

import sys

from engine.backends.llama_cpp import GgufModel, GgufSettings


def main(path: str, repack: str) -> None:
    model = GgufModel(path, GgufSettings(repack=repack == "on", n_ctx=64))
    with open("/proc/self/maps", encoding="utf-8") as maps:
        print(path in maps.read())
    del model


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
