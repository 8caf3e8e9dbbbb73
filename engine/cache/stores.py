"""Open the store for a location: a Redis server for a ``redis://`` URL, else a local diskcache directory
(read-only when this process cannot write it).

The store verbs and :class:`StoreUnavailable` are in :mod:`engine.cache.store` (re-exported here for callers).
"""
from __future__ import annotations

import logging
import os

from engine.cache.disk_store import DEFAULT_SIZE_LIMIT, DiskStore
from engine.cache.readonly_store import ReadOnlyDiskStore
from engine.cache.store import Store, StoreReadOnly, StoreUnavailable

log = logging.getLogger(__name__)

__all__ = ["Store", "StoreUnavailable", "is_url", "open_store"]


def is_url(location: str | os.PathLike) -> bool:
    return isinstance(location, str) and location.startswith(("redis://", "rediss://", "unix://"))


def open_store(location: str | os.PathLike, *, size_limit_bytes: int | None = None,
               max_entries: int | None = None, namespace: str | None = None) -> Store:
    """A Redis store for a ``redis://`` URL, else a diskcache store in the directory ``location``: read-only,
    with a note in its ``location``, when this process cannot write it."""
    if is_url(location):
        # redis-py is imported only when a URL asks for it
        from engine.cache.redis_store import DEFAULT_MAX_ENTRIES, DEFAULT_NAMESPACE, RedisStore

        return RedisStore(str(location), namespace=namespace or DEFAULT_NAMESPACE,
                          max_entries=max_entries or DEFAULT_MAX_ENTRIES)
    try:
        return DiskStore(location, size_limit_bytes=size_limit_bytes or DEFAULT_SIZE_LIMIT)
    except StoreReadOnly as err:
        store = ReadOnlyDiskStore(location, err.why)
        log.warning(store.note)
        return store
