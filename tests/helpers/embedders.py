"""Embedders for the cache tests whose notion of a paraphrase is known, so a test can say which prompts match."""
from __future__ import annotations

from engine.cache.embedder import HashEmbedder


class PrefixBlindEmbedder(HashEmbedder):
    """Fake: ignores a leading "please ", so "please X" is a semantic (not exact) match of "X"."""

    def encode(self, texts):
        return super().encode([t.removeprefix("please ") for t in texts])
