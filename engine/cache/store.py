"""What the semantic cache asks of the place that keeps its records: the :class:`Store` verbs.

A store keeps JSON records (the wire format of :class:`engine.cache.records.CacheRecord`) under entry keys,
hands them back as checked ``CacheRecord`` values, and knows nothing about embeddings, scopes or guards;
:class:`engine.cache.semantic_cache.SemanticCache` does all that on top of any store.
:class:`engine.cache.disk_store.DiskStore` keeps them in a diskcache directory,
:class:`engine.cache.redis_store.RedisStore` in a Redis server shared by many app instances, and
:class:`engine.cache.readonly_store.ReadOnlyDiskStore` serves a directory this process may not write;
:func:`engine.cache.stores.open_store` picks one from a location.

A store raises :class:`StoreUnavailable` when it cannot be reached or written (Redis down, disk read-only or
full; :class:`StoreUnreachable` when the server did not answer), and skips a malformed record (``get`` gives
None); anything else it raises is a bug and propagates.
"""
from __future__ import annotations

from collections.abc import Hashable, Iterator
from typing import Protocol, TypeAlias, runtime_checkable

import numpy as np

from engine.cache.records import CacheRecord

Token: TypeAlias = Hashable
"""A store's change token: opaque to the cache, compared only for equality (a counter, a stream id)."""

Change: TypeAlias = tuple[str, str]
"""(op, entry key), op one of "put", "del", "clear"."""


class StoreUnavailable(RuntimeError):
    """The storage cannot be used right now; the message is safe to show (no passwords)."""


class StoreUnreachable(StoreUnavailable):
    """The server did not answer (down, too slow). Unlike a full disk or a refused write, this is over as soon
    as any verb reaches the server again: a read that succeeds clears a write that failed this way."""


class StoreReadOnly(StoreUnavailable):
    """A local directory this process may read but not write (``open_store`` then opens it read-only)."""

    def __init__(self, directory: str, why: str):
        super().__init__(f"disk cache at {directory} cannot be written ({why})")
        self.why = why


@runtime_checkable
class Store(Protocol):
    """The store verbs. ``after``/``since`` is the token the caller saw last (None: none yet)."""

    location: str
    """Where the records are, safe to show (passwords masked)."""

    shared: bool
    """Whether other machines' programs write here too (Redis): the cache then trusts a record only when it
    carries a valid signature (engine/cache/records.py), and serves nothing unverified without one."""

    def get(self, key: str) -> CacheRecord | None:
        """A checked record, or None: missing, expired, or malformed (skipped and set aside with a warning)."""

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        """Store the record ``text``. Gives the store's new token when nobody else changed it since ``after``
        (so the caller need not reload), else None."""

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        """(whether the entry existed, the new token as for :meth:`put`)."""

    def clear(self) -> None:
        """Remove every record."""

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
        """Every live, well-formed record as (key, record)."""

    def count(self) -> int:
        """How many live records there are."""

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        """(the current token, what changed after ``since``); None for the list means "reload all"."""

    def close(self) -> None:
        """Let go of files and connections."""


@runtime_checkable
class SearchingStore(Store, Protocol):
    """A store that can also search embeddings itself (Redis 8 vector sets); see engine/cache/search.py."""

    search: str
    """Which search path runs, e.g. "Redis 8.2.3 vector set" ("" until connected)."""

    def server_search(self) -> bool:
        """Whether the server searches; asked once (may connect, may raise StoreUnavailable)."""

    def similar(self, scope: str, query: np.ndarray, count: int, ef: int) -> list[tuple[str, float]]:
        """The ``count`` nearest (entry key, approximate cosine) of ``scope``, best first."""

    def get_many(self, keys: list[str]) -> list[CacheRecord | None]:
        """:meth:`get` for several keys in one round trip."""

    def forget(self, scope: str, keys: list[str]) -> int:
        """Drop the vectors of entries whose record is gone; how many were dropped."""
