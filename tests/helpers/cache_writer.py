"""One of two processes writing one semantic cache directory at once (tests/cache/test_semantic_cache.py).

``python -m tests.helpers.cache_writer DIRECTORY NAME N`` prints "ready", then stores N entries in two halves;
each half starts on a line from stdin and ends with "half", so the test decides how the writers interleave.
"""
from __future__ import annotations

import sys

from engine.cache.embedder import HashEmbedder
from engine.cache.semantic_cache import SemanticCache


def main(directory: str, name: str, n: int) -> None:
    cache = SemanticCache(directory, HashEmbedder(64))
    print("ready", flush=True)
    for half in (range(n // 2), range(n // 2, n)):
        sys.stdin.readline()  # each half starts when the test says so: the writers interleave by construction
        for i in half:
            assert cache.store(f"{name} question {i}", "scope", f"{name} answer {i}", [i], complete=True)
        print("half", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
