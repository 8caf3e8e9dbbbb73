"""What a row of the local cache may hold, and how anything else is set aside without touching a file.

The local store (:mod:`engine.cache.disk_store`) keeps JSON text and one counter in diskcache's SQLite file
``cache.db``. diskcache can also keep a value in a file beside the database: it stores the file's relative path
in the row's ``filename`` column, reads that file back on a lookup and, on a delete, ``os.remove``s it and
``os.removedirs`` its parents. A row planted with ``filename='../../victim/notes.txt'`` (or an absolute path,
or a path through a symbolic link) would make the cache read and delete files anywhere. So:

- :class:`PlainDisk` keeps every value inline (no entry ever has a file), refuses to read a row that names a
  file or holds a pickle, and never removes a file;
- :func:`set_aside_unexpected` finds every row that is not what the store writes (:data:`EXPECTED_ROW`), and
  every setting diskcache would not write itself, copies them to ``quarantine.jsonl`` (base64, never loaded;
  a symbolic link there is not followed) and deletes them with plain ``sqlite3`` by rowid: the file system
  is never asked to touch what a row names;
- :func:`check_no_links` refuses a database whose files are symbolic links out of the directory.
"""
from __future__ import annotations

import base64
import json
import logging
import os
import sqlite3
import time
import warnings

import diskcache

from engine.cache.records import BadRecord
from engine.cache.store import StoreUnavailable

log = logging.getLogger(__name__)

DB_NAME = "cache.db"
QUARANTINE = "quarantine.jsonl"
_MODE_RAW = diskcache.core.MODE_RAW
_MAX_INT = 2**63 - 1
# Every setting passed explicitly, so nothing a planted Settings row says is used (diskcache lets the
# arguments win over the database); values stay inline whatever their size.
SETTINGS = {**diskcache.core.DEFAULT_SETTINGS, "eviction_policy": "least-recently-stored",
            "disk_min_file_size": _MAX_INT}
# The only rows the store writes: a text key, an inline text (record) or integer (counter) value, no file.
EXPECTED_ROW = (f"raw = 1 AND mode = {_MODE_RAW} AND filename IS NULL AND typeof(key) = 'text' "
                "AND typeof(value) IN ('text', 'integer') AND size = 0")
_DB_FILES = (DB_NAME, DB_NAME + "-wal", DB_NAME + "-shm", DB_NAME + "-journal")


class UnsafeKey:
    """Stands for a pickled key that was never unpickled; skipped by every caller."""


class PlainDisk(diskcache.Disk):
    """A diskcache Disk for str/int/float keys and values, all kept inline; files are never read or removed."""

    def put(self, key):
        if type(key) not in (str, int, float):
            raise TypeError(f"cache keys must be str, int or float, got {type(key).__name__}")
        return super().put(key)

    def get(self, key, raw):
        return super().get(key, raw) if raw else UnsafeKey()

    def store(self, value, read, key=diskcache.core.UNKNOWN):
        if read or type(value) not in (str, int, float) or (type(value) is int and abs(value) > _MAX_INT):
            raise TypeError(f"cache values must be str, float or a 64-bit int, got {type(value).__name__}")
        return 0, _MODE_RAW, None, value  # (size, mode, filename, value): inline, whatever the length

    def fetch(self, mode, filename, value, read):
        if filename is not None:
            raise BadRecord(f"a row naming the file {filename!r} (refused: the cache keeps no files)")
        if mode != _MODE_RAW:
            raise BadRecord(f"a row in diskcache mode {mode} (refused: only inline text is read)")
        return super().fetch(mode, filename, value, read)

    def remove(self, file_path):
        """diskcache calls this for a deleted, expired or evicted row's file. The store writes no files, so a
        row naming one was planted: its path is never touched."""
        log.warning("semantic cache: not removing %r, named by a cache row (the cache keeps no files)", file_path)


def check_no_links(directory: str) -> None:
    """StoreUnavailable when the database (or its journal) is a symbolic link: SQLite would follow it."""
    for name in _DB_FILES:
        if os.path.islink(path := os.path.join(directory, name)):
            raise StoreUnavailable(f"disk cache at {directory}: {name} is a symbolic link (to {os.readlink(path)}); "
                                   "the cache follows no links out of its directory: remove it")


def _text(value) -> str | int | float | None:
    return base64.b64encode(bytes(value)).decode() if isinstance(value, (bytes, memoryview)) else value


def _append_quarantine(directory: str, rows: list[dict]) -> str:
    """Append to ``<dir>/quarantine.jsonl`` without following a link; says where they went."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(os.path.join(directory, QUARANTINE), flags, 0o600)
    except OSError as err:
        return f"not copied to {QUARANTINE} ({err.strerror})"
    with open(fd, "a", encoding="utf-8") as out:
        out.writelines(json.dumps(row) + "\n" for row in rows)
    return f"copied to {QUARANTINE}"


def set_aside_unexpected(directory: str) -> int:
    """Delete from ``<dir>/cache.db`` (plain sqlite3, by rowid) every row the store would not write and every
    setting diskcache would not write itself, after copying them to quarantine.jsonl; warns once with the
    count. Raises sqlite3/OS errors (a read-only or corrupt database) to the caller."""
    db = os.path.join(directory, DB_NAME)
    if not os.path.isfile(db):
        return 0
    check_no_links(directory)
    con = sqlite3.connect(db, timeout=60)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        rows = []
        if "Cache" in tables:
            rows = [{"table": "Cache", "rowid": r[0], "key": _text(r[1]), "raw": r[2], "mode": r[3], "file": r[4],
                     "value": _text(r[5])} for r in con.execute(
                        f"SELECT rowid, key, raw, mode, filename, value FROM Cache WHERE NOT ({EXPECTED_ROW})")]
        if "Settings" in tables:
            known = set(SETTINGS) | set(diskcache.core.METADATA)
            rows += [{"table": "Settings", "rowid": r[0], "key": _text(r[1]), "value": _text(r[2])}
                     for r in con.execute("SELECT rowid, key, value FROM Settings")
                     if r[1] not in known or (r[1] in diskcache.core.METADATA and type(r[2]) is not int)]
        if not rows:
            return 0
        moved = time.time()
        where = _append_quarantine(directory, [{**row, "moved": moved} for row in rows])
        with con:
            for row in rows:
                con.execute(f"DELETE FROM {row['table']} WHERE rowid = ?", (row["rowid"],))
    finally:
        con.close()
    message = (f"semantic cache at {directory}: removed {len(rows)} unexpected row(s) (files named by a row, "
               f"pickles, unknown settings; no file they name was touched), {where}")
    log.warning(message)
    warnings.warn(message, RuntimeWarning, stacklevel=4)
    return len(rows)


def delete_key(directory: str, key: str) -> None:
    """Delete the row(s) under ``key`` in SQL: no file is touched, whatever the row names."""
    con = sqlite3.connect(os.path.join(directory, DB_NAME), timeout=60)
    try:
        with con:
            con.execute("DELETE FROM Cache WHERE key = ?", (key,))
    finally:
        con.close()
