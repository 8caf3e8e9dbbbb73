"""Which cache records may be believed, and which may be served without the target checking them.

A record is well-formed or not (:class:`engine.cache.records.CacheRecord` checks itself); whether it is
*honest* depends on who can write the store. A local directory is written by its user: direct mode may serve
its hits as they are. A shared store (Redis) is written by every instance that has its URL, so without a secret nothing from it
is served unverified: every hit goes to the target as a draft. With a secret the instances share, every record
is signed (HMAC-SHA256, :meth:`engine.cache.records.CacheRecord.mac_for`) and one that is unsigned, signed with
another key, altered, or moved under another prompt's key is refused with a warning (once per entry), whatever
the store and the mode.
"""
from __future__ import annotations

import logging

from engine.cache.records import CacheRecord
from engine.errors import InvalidSettingError

log = logging.getLogger(__name__)

MIN_SECRET_BYTES = 16


def check_secret(secret: str | bytes | None) -> bytes | None:
    """The cache secret as bytes (None: records are not signed). A short one is refused: it could be guessed."""
    if secret is None:
        return None
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    if not isinstance(raw, bytes) or len(raw) < MIN_SECRET_BYTES:
        raise InvalidSettingError(f"the cache secret must be at least {MIN_SECRET_BYTES} bytes (e.g. the output "
                                  "of `openssl rand -hex 32`), shared by every instance of the cache")
    return raw


class Trust:
    """The cache's trust in its store. ``serves_unverified``: direct mode may serve a hit without the target."""

    def __init__(self, secret: bytes | None, shared: bool):
        self.secret = secret
        self.serves_unverified = secret is not None or not shared
        self._refused: set[str] = set()

    @property
    def unverified_reason(self) -> str:
        """Why a direct-mode hit goes to the target ("" when it need not)."""
        if self.serves_unverified:
            return ""
        return "a shared cache without a secret (--cache-secret): the target verifies every hit"

    def believes(self, key: str, rec: CacheRecord, entry_key: str) -> bool:
        """Whether ``rec``, found under ``key``, may be used: it must sit under its own prompt's key
        (``entry_key``, computed by the caller) and, with a secret, carry a valid signature."""
        if key != entry_key:
            problem = "it sits under another prompt's key"
        elif self.secret is not None and not rec.is_signed_by(self.secret):
            problem = "its signature does not check (unsigned, another key, or altered)"
        else:
            return True
        if key not in self._refused:
            self._refused.add(key)
            log.warning("semantic cache: entry %s refused: %s", key, problem)
        return False
