"""A local cache directory this process may read but not write: its entries are served, nothing is stored.

A cache copied from elsewhere, on a read-only mount, or owned by another user is still worth reading. diskcache
cannot open a directory it cannot write (it writes its settings first), so this store reads ``cache.db`` with
plain ``sqlite3`` in read-only mode, and only rows the writable store would write
(:data:`engine.cache.disk_rows.EXPECTED_ROW`): a planted row is never read, and nothing is ever deleted or
moved. Writes raise :class:`StoreUnavailable` with the note that the cache is read-only, which the semantic
cache shows as its warning.
"""
from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from urllib.parse import quote

from engine.cache.disk_rows import DB_NAME, EXPECTED_ROW, check_no_links
from engine.cache.disk_store import PREFIX, VERSION_KEY
from engine.cache.records import BadRecord, CacheRecord
from engine.cache.store import Change, StoreUnavailable, Token

log = logging.getLogger(__name__)

_LIVE = f"{EXPECTED_ROW} AND (expire_time IS NULL OR expire_time > ?)"


class ReadOnlyDiskStore:
    """Serve the records of a diskcache directory without writing anything. See the module docstring."""

    shared = False

    def __init__(self, directory: str | os.PathLike, why: str):
        self.directory = os.fspath(directory)
        self.location = f"{self.directory} (read-only: its answers are served, new answers are not stored)"
        self.note = f"semantic cache at {self.directory} is read-only ({why}); new answers are not stored"
        self._warned: set[str] = set()
        self._rows("SELECT count(*) FROM Cache")  # unreadable now: unavailable now

    def _rows(self, query: str, *args) -> list[tuple]:
        """Read-only SQLite. A WAL database needs its ``-shm`` file, which a read-only directory cannot hold:
        then it is opened as immutable (what a cleanly closed cache has in its WAL is already in the file)."""
        check_no_links(self.directory)
        uri = "file:" + quote(os.path.join(self.directory, DB_NAME)) + "?mode=ro"
        try:
            try:
                return self._query(uri, query, args)
            except sqlite3.OperationalError:
                return self._query(uri + "&immutable=1", query, args)
        except sqlite3.DatabaseError as err:  # missing, unreadable, corrupt: nothing here can be served
            raise StoreUnavailable(f"read-only disk cache at {self.directory}: {type(err).__name__}: {err}") from err

    @staticmethod
    def _query(uri: str, query: str, args: tuple) -> list[tuple]:
        con = sqlite3.connect(uri, uri=True, timeout=5)
        try:
            return con.execute(query, args).fetchall()
        finally:
            con.close()

    def _decode(self, key: str, text) -> CacheRecord | None:
        try:
            return CacheRecord.from_json(text)
        except BadRecord as err:
            if key not in self._warned:  # cannot be deleted here: skipped, with one warning per entry
                self._warned.add(key)
                log.warning("semantic cache: skipping the malformed entry %s in read-only %s: %s",
                            key, self.directory, err)
            return None

    # ---- the store verbs (engine.cache.store.Store) ------------------------------------------------
    def get(self, key: str) -> CacheRecord | None:
        rows = self._rows(f"SELECT value FROM Cache WHERE key = ? AND {_LIVE}", PREFIX + key, time.time())
        return self._decode(key, rows[0][0]) if rows else None

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        raise StoreUnavailable(self.note)

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        raise StoreUnavailable(self.note)

    def clear(self) -> None:
        raise StoreUnavailable(self.note)

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
        rows = self._rows(f"SELECT key, value FROM Cache WHERE substr(key, 1, ?) = ? AND {_LIVE}",
                          len(PREFIX), PREFIX, time.time())
        found = ((key[len(PREFIX):], self._decode(key[len(PREFIX):], text)) for key, text in rows)
        return iter([(key, rec) for key, rec in found if rec is not None])

    def count(self) -> int:
        return self._rows(f"SELECT count(*) FROM Cache WHERE substr(key, 1, ?) = ? AND {_LIVE}",
                          len(PREFIX), PREFIX, time.time())[0][0]

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        """Another process may still write the directory: its counter says when to reload."""
        rows = self._rows(f"SELECT value FROM Cache WHERE key = ? AND {EXPECTED_ROW}", VERSION_KEY)
        token = rows[0][0] if rows else 0
        return token, ([] if token == since else None)

    def close(self) -> None:
        pass
