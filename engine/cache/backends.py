"""Where cache entries live: a local diskcache directory, or a Redis server shared by many app instances.

A store keeps JSON records (see :mod:`engine.cache.records`) under entry keys and knows nothing about
embeddings, scopes or guards; :class:`engine.cache.semantic_cache.SemanticCache` does all that on top of
either store. The verbs every store has:

- ``get(key) -> dict | None``: a checked record, or None (missing, expired, or malformed: skipped and set
  aside with a warning)
- ``put(key, text, ttl_s, after) -> token | None`` and ``delete(key, after) -> (existed, token | None)``:
  the token is the store's new change token when nobody else changed the store since ``after``
- ``clear()``, ``records() -> iterator of (key, record)``, ``count()``
- ``changes(since) -> (token, [(op, key)] | None)``: what changed since a token; None means "reload all"
- ``location``: where it is, safe to show (passwords masked); ``close()``

A store raises :class:`StoreUnavailable` when it cannot be reached (Redis down, disk read-only or full).
"""
from __future__ import annotations

import os


class StoreUnavailable(RuntimeError):
    """The storage cannot be used right now; the message is safe to show (no passwords)."""


def is_url(location: str | os.PathLike) -> bool:
    return isinstance(location, str) and location.startswith(("redis://", "rediss://", "unix://"))


def open_store(location: str | os.PathLike, *, size_limit_bytes: int | None = None,
               max_entries: int | None = None, namespace: str | None = None):
    """A Redis store for a ``redis://`` URL, else a diskcache store in the directory ``location``."""
    if is_url(location):
        from engine.cache.redis_store import DEFAULT_MAX_ENTRIES, DEFAULT_NAMESPACE, RedisStore

        return RedisStore(str(location), namespace=namespace or DEFAULT_NAMESPACE,
                          max_entries=max_entries or DEFAULT_MAX_ENTRIES)
    from engine.cache.disk_store import DEFAULT_SIZE_LIMIT, DiskStore

    return DiskStore(location, size_limit_bytes=size_limit_bytes or DEFAULT_SIZE_LIMIT)
