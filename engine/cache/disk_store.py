"""The local cache store: diskcache (SQLite) in one directory, holding JSON text only, every value inline.

What a row may hold, and how a planted one (a pickle, a file name, an unknown setting) is set aside without
touching any file, is :mod:`engine.cache.disk_rows`: unpickling runs code, and a row naming a file would make
diskcache read or delete that file wherever it is.

Process safety: every write or delete bumps a counter with ``cache.incr`` *after* the change; a reader
reloads when the counter moved, so another process's writes show up at its next lookup.

Failures: a directory this process cannot write is :class:`StoreReadOnly` (``open_store`` then serves it
read-only, :mod:`engine.cache.readonly_store`); a database SQLite calls corrupt is moved aside and the store
starts empty; a locked or full one (``sqlite3.OperationalError``, ``diskcache.Timeout``, ``OSError``) is
:class:`StoreUnavailable`; a malformed record is skipped and deleted by key in SQL. Anything else is a bug and
propagates.
"""
from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator

import diskcache

from engine.cache.disk_rows import DB_NAME, SETTINGS, PlainDisk, check_no_links, delete_key, set_aside_unexpected
from engine.cache.records import BadRecord, CacheRecord
from engine.cache.store import Change, StoreReadOnly, StoreUnavailable, Token

log = logging.getLogger(__name__)

DEFAULT_SIZE_LIMIT = 512 * 2**20
VERSION_KEY = "meta:version"
PREFIX = "e:"
_TAG = "entry"
# the disk or the database cannot be used now: locked (diskcache gives up on a busy lock with Timeout),
# read-only, full, gone
_UNAVAILABLE = (sqlite3.OperationalError, diskcache.Timeout, OSError)


def _aside_path(directory: str) -> str:
    """``<dir>.corrupt-<timestamp>-<pid>``, with a counter when that name is taken."""
    base = f"{directory}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return next(p for n in itertools.count() if not os.path.lexists(p := f"{base}-{n}" if n else base))


def _is_corruption(err: BaseException) -> bool:
    """'file is not a database', 'disk image is malformed'; not 'database is locked' (OperationalError)."""
    return isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError)


def write_problem(directory: str) -> str | None:
    """Why this process cannot write the cache in ``directory`` (tried, not guessed from permission bits:
    root, immutable files and read-only mounts all answer truly), or None."""
    try:
        with tempfile.TemporaryFile(dir=directory):
            pass
        db = os.path.join(directory, DB_NAME)
        if os.path.exists(db):
            os.close(os.open(db, os.O_RDWR))
    except OSError as err:
        return f"{type(err).__name__}: {err.strerror}"
    return None


class DiskStore:
    """Cache records in a local diskcache directory. See the module docstring."""

    shared = False  # one user's directory: what is in it, that user (or their copy) put there

    def __init__(self, directory: str | os.PathLike, size_limit_bytes: int = DEFAULT_SIZE_LIMIT):
        self.directory = self.location = os.fspath(directory)
        self.size_limit_bytes = int(size_limit_bytes)
        self._lock = threading.RLock()
        self._warned = False
        self._cache = self._open()

    # ---- plumbing ------------------------------------------------------------------------------
    def _open(self) -> diskcache.Cache:
        """Open the directory. StoreReadOnly when this process cannot write it; a database SQLite calls corrupt
        is moved aside and a fresh one made; StoreUnavailable when it is locked, or the fresh start fails too."""
        if os.path.lexists(self.directory) and not os.path.isdir(self.directory):
            raise StoreUnavailable(f"disk cache at {self.directory}: that is a file, not a directory; it is left "
                                   "as it is and the cache is off")

        def attempt() -> diskcache.Cache:
            if os.path.isdir(self.directory):
                check_no_links(self.directory)
                if problem := write_problem(self.directory):
                    raise StoreReadOnly(self.directory, problem)
                set_aside_unexpected(self.directory)
            cache = diskcache.Cache(self.directory, disk=PlainDisk, **{**SETTINGS, "size_limit": self.size_limit_bytes})
            cache.get(VERSION_KEY)  # touch the database so that corruption shows now
            return cache
        try:
            try:
                return attempt()
            except sqlite3.DatabaseError as err:
                if not _is_corruption(err):
                    raise
                self._move_aside(err)
                return attempt()
        except _UNAVAILABLE as err:
            raise self._unavailable(err) from err

    def _unavailable(self, err: BaseException) -> StoreUnavailable:
        return StoreUnavailable(f"disk cache at {self.directory}: {type(err).__name__}: {err}")

    def _move_aside(self, err: BaseException) -> None:
        """Only for a database SQLite itself calls corrupt; the message says what was really done."""
        aside = _aside_path(self.directory)
        try:
            os.replace(self.directory, aside)
        except OSError as move_err:
            raise StoreUnavailable(f"semantic cache at {self.directory} is unreadable ({err}) and could not be "
                                   f"moved aside ({move_err.strerror}); running without it") from move_err
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
        version = self._cache.incr(VERSION_KEY, default=0)
        return version if after is not None and version == after + 1 else None

    def _read(self, key: str) -> CacheRecord | None:
        try:
            raw = self._cache.get(PREFIX + key)
            return None if raw is None else CacheRecord.from_json(raw)
        except BadRecord as err:
            self._drop(key, err)
            return None

    def _drop(self, key: str, err: BadRecord) -> None:
        """Delete a bad row by key in SQL (no file it names is touched); the first one per store is a warning."""
        message = f"semantic cache at {self.directory}: deleted the malformed entry {key}: {err}"
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=5)
        log.warning(message)
        delete_key(self.directory, PREFIX + key)

    def _keys(self) -> list[str]:
        return [k[len(PREFIX):] for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(PREFIX)]

    # ---- the store verbs (engine.cache.store.Store) ------------------------------------------------
    def get(self, key: str) -> CacheRecord | None:
        return self._call(lambda: self._read(key))

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        def write():
            self._cache.set(PREFIX + key, text, expire=ttl_s, tag=_TAG)
            return self._bump(after)
        return self._call(write)

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        def remove():
            existed = bool(self._cache.delete(PREFIX + key))
            return existed, self._bump(after)
        return self._call(remove)

    def clear(self) -> None:
        def wipe():
            self._cache.evict(_TAG)
            self._bump(None)
        self._call(wipe)

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
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
        token = self._call(lambda: self._cache.get(VERSION_KEY, 0))
        return token, ([] if token == since else None)

    def close(self) -> None:
        self._cache.close()
