"""Where the semantic tier searches: in this instance's memory, or on the server.

- :class:`MirrorIndex`: every embedding of the store in memory (:class:`EmbeddingIndex`), kept up to date
  through the store's change log; an exact scan per lookup. For a local directory, and for Redis servers
  without vector sets (7.x).
- :class:`ServerIndex`: the store searches (Redis 8 vector sets, HNSW over int8 vectors); this instance
  holds no embeddings. HNSW and int8 are approximate, so it asks for :data:`SERVER_COUNT` neighbours with
  exploration factor :data:`SERVER_EF`, and the candidates that could reach the threshold are re-scored
  exactly with the float32 embeddings of their records: the guards and the judge see the similarities an
  exact search gives (bench/cache/evaluate.py ``--exactness`` measures that the outcomes are the same).

:func:`index_for` picks one for a store.
"""
from __future__ import annotations

import logging
from typing import NamedTuple, Protocol

import numpy as np

from engine.cache.embedder import EmbeddingIndex
from engine.cache.records import CacheRecord
from engine.cache.store import SearchingStore, Store, Token
from engine.errors import InvalidSettingError

log = logging.getLogger(__name__)

TOP = 8  # candidates the cache looks at, best first
SERVER_COUNT = 32  # neighbours asked of the server
SERVER_EF = 200  # HNSW exploration factor of a lookup: 4x the smallest EF exact on the eval pairs (docs/cache.md)
INT8_MARGIN = 0.03  # an int8 cosine is within this of the float32 one (measured max ~0.01 on MiniLM vectors)
MEMORY = "in-memory index"


class Neighbour(NamedTuple):
    """A cached prompt near the query: its key, its exact cosine, and its record when the search read it."""
    key: str
    similarity: float  # exact cosine
    record: CacheRecord | None  # the record when the search already read it


def fits(key: str, rec: CacheRecord, dim: int) -> bool:
    """The record's embedding has the embedder's dimension (else it is skipped, with a warning)."""
    if rec.embedding.shape == (dim,):
        return True
    log.warning("semantic cache: entry %s has a %d-d embedding, the embedder gives %d-d; skipped",
                key, rec.embedding.shape[0], dim)
    return False


class Index(Protocol):
    """A semantic index over a store's records. ``token``: the change token the store's writes want."""

    description: str
    token: Token | None

    def refresh(self, live: int | None = None) -> None:
        """Catch up with the store's logged changes; with ``live`` (its record count, when the caller counted)
        also with what it dropped without a log entry (TTL, eviction)."""

    def search(self, scope: str, query: np.ndarray, floor: float) -> list[Neighbour]:
        """The best :data:`TOP` candidates of ``scope``, best first; those below ``floor`` may be left out.
        Searches what the index holds now: the caller refreshes first when it wants other instances' writes."""

    def wrote(self, scope: str, key: str, vec: np.ndarray, token: Token | None) -> None:
        """This instance stored ``key``; ``token``: what the store's put gave."""

    def removed(self, key: str, token: Token | None) -> None:
        """This instance deleted ``key``."""

    def invalidate(self) -> None:
        """Reload everything at the next refresh (the store failed, or was cleared)."""


class MirrorIndex:
    """The store's embeddings in memory, synced through ``store.changes``. See the module docstring."""

    def __init__(self, store: Store, dim: int):
        self._store, self._dim = store, dim
        self.description = getattr(store, "search", "") or MEMORY
        self._index, self.token = EmbeddingIndex(), None  # None: reload all at the next refresh

    def __len__(self) -> int:
        return len(self._index)

    def refresh(self, live: int | None = None) -> None:
        self._sync()
        if live is not None and live != len(self._index):  # evicted or expired without a logged change
            self.token = None
            self._sync()

    def _sync(self) -> None:
        token, changes = self._store.changes(self.token)
        if changes is None:
            index = EmbeddingIndex()
            for key, rec in self._store.records():
                self._add(index, key, rec)
            self._index = index
        else:
            for op, key in changes:
                rec = self._store.get(key) if op == "put" else None
                if rec is None:
                    self._index.remove(key)
                else:
                    self._add(self._index, key, rec)
        self.token = token

    def _add(self, index: EmbeddingIndex, key: str, rec: CacheRecord) -> None:
        if fits(key, rec, self._dim):
            index.add(rec.scope, key, rec.embedding)

    def search(self, scope: str, query: np.ndarray, floor: float) -> list[Neighbour]:
        return [Neighbour(key, sim, None) for key, sim in self._index.search(scope, query, TOP)]

    def wrote(self, scope: str, key: str, vec: np.ndarray, token: Token | None) -> None:
        self._index.add(scope, key, vec)
        if token is not None:
            self.token = token

    def removed(self, key: str, token: Token | None) -> None:
        self._index.remove(key)
        if token is not None:
            self.token = token

    def invalidate(self) -> None:
        self.token = None


class ServerIndex:
    """The store searches; nothing is held here. See the module docstring."""

    token = None

    def __init__(self, store: SearchingStore, dim: int, count: int = SERVER_COUNT, ef: int = SERVER_EF):
        self._store, self._dim, self.count, self.ef = store, dim, int(count), int(ef)
        self.description = store.search

    def refresh(self, live: int | None = None) -> None:
        """Nothing to load: the server is the index."""

    def search(self, scope: str, query: np.ndarray, floor: float) -> list[Neighbour]:
        near = [key for key, sim in self._store.similar(scope, query, self.count, self.ef)
                if sim >= floor - INT8_MARGIN]
        out, gone = [], []
        for key, rec in zip(near, self._store.get_many(near)):
            if rec is None:
                gone.append(key)  # expired or moved aside: its vector is an orphan
            elif fits(key, rec, self._dim):
                sim = float(np.einsum("nd,d->n", rec.embedding[None, :], query)[0])  # as EmbeddingIndex does
                out.append(Neighbour(key, min(1.0, sim), rec))
        if gone:
            self._store.forget(scope, gone)
        return sorted(out, key=lambda c: -c.similarity)[:TOP]

    def wrote(self, scope: str, key: str, vec: np.ndarray, token: Token | None) -> None:
        """Nothing to add: the store's put wrote the vector with the entry, in one MULTI."""

    def removed(self, key: str, token: Token | None) -> None:
        """Nothing to drop: the store's delete removed the vector too."""

    def invalidate(self) -> None:
        """Nothing cached here to reload after a reconnect."""


SEARCHES = ("auto", "memory")


def check_search(search: str, ef: int) -> None:
    """``search``: "auto" (on the server when it can) or "memory" (always the exact in-memory scan)."""
    if search not in SEARCHES:
        raise InvalidSettingError(f"cache search must be one of {', '.join(SEARCHES)}, got {search!r}")
    if not (isinstance(ef, int) and 1 <= ef <= 100_000):
        raise InvalidSettingError(f"cache search EF must be an integer in 1-100000, got {ef!r}")


def index_for(store: Store, dim: int, search: str = "auto", ef: int = SERVER_EF) -> Index:
    """A :class:`ServerIndex` when the store searches itself (and ``search`` is "auto"), else a
    :class:`MirrorIndex`. May raise StoreUnavailable (a Redis store asks its server)."""
    if search == "auto" and isinstance(store, SearchingStore) and store.server_search():
        return ServerIndex(store, dim, ef=ef)
    return MirrorIndex(store, dim)
