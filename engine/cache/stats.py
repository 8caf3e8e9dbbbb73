"""What the semantic cache reports about itself: its counters (:class:`CacheStats`) and its entries
(:class:`CacheEntry`), as frozen values.

They live here, below ``engine.surface`` (which re-exports them): the cache builds them, and the engine
surface hands them to the app as they are. Plain data, no imports beyond the standard library: the app
reads them, and the app never imports torch.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class CacheStats:
    entries: int
    lookups: int = 0
    hits: Mapping[str, int] = field(default_factory=dict)  # outcome ("exact", "verified", "cached") -> count
    misses: int = 0
    hit_rate: float = 0.0
    time_saved_s: float = 0.0  # generation time that hits saved
    warning: str = ""  # why the cache is not working right now (e.g. Redis unreachable), or empty
    backend: str = ""  # where the entries live, safe to show (passwords masked)
    search: str = ""  # where the semantic search runs, e.g. "Redis 8.2.3 vector set" ("" before the store answered)


@dataclass(frozen=True)
class CacheEntry:
    key: str
    prompt: str
    answer: str  # a preview
    created: float  # unix seconds
    scope: str = ""  # the scope it is served in (engine.cache.keys.make_scope)
