"""The local cache store: diskcache (SQLite) in one directory, holding JSON text only.

diskcache pickles keys and values by default, and unpickling runs code: a pickle planted in the cache
directory would run when the cache is read. :class:`PlainDisk` stores only strings and numbers and refuses
to unpickle anything; rows that hold pickles are moved to ``<dir>/quarantine.jsonl`` (base64, never
loaded) with plain ``sqlite3`` before diskcache opens the directory.

Process safety: every write or delete bumps a counter with ``cache.incr`` *after* the change; a reader
reloads when the counter moved, so another process's writes show up at its next lookup.

Failures: a corrupt database is moved aside and the store starts empty; a locked, read-only or full one
(``sqlite3.OperationalError``, ``diskcache.Timeout``, ``OSError``) is :class:`StoreUnavailable`; a malformed
record is skipped and dropped. Anything else is a bug and propagates.
"""
from __future__ import annotations

import base64
import itertools
import json
import logging
import os
import sqlite3
import threading
import time
import warnings
from collections.abc import Iterator

import diskcache

from engine.cache.records import BadRecord, decode_record
from engine.cache.store import Change, StoreUnavailable, Token

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT = 512 * 2**20
_VERSION_KEY = "meta:version"
_PREFIX = "e:"
_TAG = "entry"
_MODE_PICKLE = 4  # diskcache.core.MODE_PICKLE
# the disk or the database cannot be used now: locked (diskcache gives up on a busy lock with Timeout),
# read-only, full, gone
_UNAVAILABLE = (sqlite3.OperationalError, diskcache.Timeout, OSError)


class _UnsafeKey:
    """Stands for a pickled key that was never unpickled; skipped by every caller."""


class PlainDisk(diskcache.Disk):
    """A diskcache Disk for str/int/float keys and values only; pickled rows are never loaded."""

    def put(self, key):
        if type(key) not in (str, int, float):
            raise TypeError(f"cache keys must be str, int or float, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        return super().get(key, raw) if raw else _UnsafeKey()

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if read or type(value) not in (str, int, float):
            raise TypeError(f"cache values must be str, int or float, got {type(value).__name__}")
        return super().store(value, read, key=key)

    def fetch(self, mode, filename, value, read):
        if mode == _MODE_PICKLE:
            raise BadRecord("a pickled value (refused: unpickling runs code)")
        return super().fetch(mode, filename, value, read)


def _aside_path(directory: str) -> str:
    """``<dir>.corrupt-<timestamp>-<pid>``, with a counter when that name is taken."""
    base = f"{directory}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return next(p for n in itertools.count() if not os.path.lexists(p := f"{base}-{n}" if n else base))


def _is_corruption(err: BaseException) -> bool:
    """'file is not a database', 'disk image is malformed'; not 'database is locked' (OperationalError)."""
    return isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError)


def quarantine_pickles(directory: str) -> int:
    """Move rows with pickled keys or values out of ``<dir>/cache.db`` into ``<dir>/quarantine.jsonl``."""
    db = os.path.join(directory, "cache.db")
    if not os.path.isfile(db):
        return 0
    con = sqlite3.connect(db, timeout=60)
    try:
        if not con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='Cache'").fetchone():
            return 0
        rows = con.execute("SELECT rowid, key, raw, mode, filename, value FROM Cache WHERE raw = 0 OR mode = ?",
                           (_MODE_PICKLE,)).fetchall()
        if not rows:
            return 0
        with open(os.path.join(directory, "quarantine.jsonl"), "a", encoding="utf-8") as out:
            for rowid, key, raw, mode, filename, value in rows:
                as_text = lambda b: base64.b64encode(bytes(b)).decode() if isinstance(b, bytes) else b  # noqa: E731
                out.write(json.dumps({"key": as_text(key), "raw": raw, "mode": mode, "file": filename,
                                      "value": as_text(value), "moved": time.time()}) + "\n")
        with con:
            con.executemany("DELETE FROM Cache WHERE rowid = ?", [(r[0],) for r in rows])
    finally:
        con.close()
    message = f"semantic cache at {directory}: {len(rows)} pickled record(s) moved to quarantine.jsonl, not loaded"
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    return len(rows)


class DiskStore:
    """Cache records in a local diskcache directory. See the module docstring."""

    def __init__(self, directory: str | os.PathLike, size_limit_bytes: int = DEFAULT_SIZE_LIMIT):
        self.directory = self.location = os.fspath(directory)
        self.size_limit_bytes = int(size_limit_bytes)
        self._lock = threading.RLock()
        self._cache = self._open()

    # ---- plumbing ------------------------------------------------------------------------------
    def _open(self) -> diskcache.Cache:
        """Open the directory; an unreadable one is moved aside and a fresh one made. StoreUnavailable when
        the database is locked, or the fresh start fails too (a read-only or full disk)."""
        def attempt() -> diskcache.Cache:
            if os.path.isdir(self.directory):
                quarantine_pickles(self.directory)
            cache = diskcache.Cache(self.directory, size_limit=self.size_limit_bytes, disk=PlainDisk,
                                    eviction_policy="least-recently-stored")
            cache.get(_VERSION_KEY)  # touch the database so that corruption shows now
            return cache
        try:
            try:
                return attempt()
            except (OSError, sqlite3.DatabaseError) as err:
                if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                    raise
                self._move_aside(err)
                return attempt()
        except _UNAVAILABLE as err:
            raise self._unavailable(err) from err

    def _unavailable(self, err: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"disk cache at {self.directory}: {type(err).__name__}: {err}")

    def _move_aside(self, err: BaseException) -> None:
        aside = _aside_path(self.directory)
        if os.path.lexists(self.directory):
            os.replace(self.directory, aside)
        message = f"semantic cache at {self.directory} was unreadable ({err}); moved to {aside}, starting empty"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)

    def _call(self, fn):
        """fn under the lock. Corruption: move aside, reopen empty, rerun. Other I/O errors: unavailable."""
        with self._lock:
            try:
                try:
                    return fn()
                except sqlite3.DatabaseError as err:
                    if not _is_corruption(err):
                        raise
                    self._cache.close()
                    self._move_aside(err)
                    self._cache = self._open()
                    return fn()
            except _UNAVAILABLE as err:
                raise self._unavailable(err) from err

    def _bump(self, after: Token | None) -> int | None:
        version = self._cache.incr(_VERSION_KEY, default=0)
        return version if after is not None and version == after + 1 else None

    def _read(self, key: str) -> dict | None:
        try:
            raw = self._cache.get(_PREFIX + key)
            return None if raw is None else decode_record(raw)
        except BadRecord as err:
            log.warning("semantic cache: skipping malformed entry %s: %s", key, err)
            self._cache.delete(_PREFIX + key)
            return None

    def _keys(self) -> list[str]:
        return [k[len(_PREFIX):] for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(_PREFIX)]

    # ---- the store verbs (engine.cache.store.Store) ------------------------------------------------
    def get(self, key: str) -> dict | None:
        return self._call(lambda: self._read(key))

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        def write():
            self._cache.set(_PREFIX + key, text, expire=ttl_s, tag=_TAG)
            return self._bump(after)
        return self._call(write)

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        def remove():
            existed = bool(self._cache.delete(_PREFIX + key))
            return existed, self._bump(after)
        return self._call(remove)

    def clear(self) -> None:
        def wipe():
            self._cache.evict(_TAG)
            self._bump(None)
        self._call(wipe)

    def records(self) -> Iterator[tuple[str, dict]]:
        def collect():
            self._cache.expire()
            return [(k, rec) for k in self._keys() if (rec := self._read(k)) is not None]
        return iter(self._call(collect))

    def count(self) -> int:
        def count():
            self._cache.expire()
            return len(self._keys())
        return self._call(count)

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        """diskcache keeps no change log: any change means "reload all"."""
        token = self._call(lambda: self._cache.get(_VERSION_KEY, 0))
        return token, ([] if token == since else None)

    def close(self) -> None:
        self._cache.close()
