"""Semantic cache in front of the engine: exact tier, semantic tier, guards, diskcache storage.

A lookup never crosses scopes (target model, precision, sampling, system prompt, earlier turns) and never
serves a confident wrong answer: in ``verify`` mode every semantic hit goes to the target as a draft
(``verified``); in ``direct`` mode a hit is served as is (``cached``) only when every guard passes.

Process safety: entries live in diskcache (SQLite). Every write or delete bumps a counter with
``cache.incr`` *after* the change, and a lookup reloads the in-memory embedding matrices when the counter
moved, so another process's writes show up at the next lookup.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import sqlite3
import threading
import time
import unicodedata
import warnings
from collections import Counter
from dataclasses import dataclass

import diskcache
import numpy as np

from engine.config import DEFAULT_CACHE_THRESHOLD as DEFAULT_THRESHOLD
from engine.config import CacheConfig, SamplingConfig
from engine.cache.embedder import EmbeddingIndex, normalise_rows
from engine.errors import InvalidSettingError
from engine.events import CacheEvent
from engine.cache.guards import failed_guards

log = logging.getLogger(__name__)

OUTCOMES = ("exact", "verified", "cached", "miss")
DEFAULT_SIZE_LIMIT = 512 * 2**20
_VERSION_KEY = "meta:version"
_PREFIX = "e:"
_TAG = "entry"


def _check_mode_and_threshold(mode: str, threshold: float) -> None:
    """The rules live in engine/config.py (CacheConfig); a lookup itself is never "off"."""
    CacheConfig(mode, threshold)
    if mode == "off":
        raise InvalidSettingError("a cache lookup needs mode 'verify' or 'direct'; 'off' skips the lookup")


def normalise_prompt(prompt: str) -> str:
    """Exact-tier key: NFKC, casefold, collapse whitespace, strip trailing punctuation."""
    s = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", prompt).casefold()).strip()
    return re.sub(r"[\s.?!,;:\u2026]+$", "", s)


def make_scope(target: str, precision: str, sampling: SamplingConfig, system_prompt: str,
               history: list[dict]) -> str:
    """Stable hash of everything besides the prompt that shapes the answer. The draft model is not in it."""
    turns = [{"role": m.get("role"), "content": m.get("content")} for m in history or []]
    payload = {
        "target": target, "precision": precision,
        "temperature": float(sampling.temperature), "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
        "seed": sampling.seed if sampling.temperature > 0 else None,
        "system": system_prompt or "",
        "history": hashlib.sha256(json.dumps(turns, sort_keys=True, default=str).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def entry_key(scope: str, prompt: str) -> str:
    return hashlib.sha256(f"{scope}\n{normalise_prompt(prompt)}".encode()).hexdigest()[:32]


@dataclass(frozen=True)
class CacheHit:
    outcome: str  # one of OUTCOMES
    entry_key: str | None = None
    prompt: str | None = None  # the cached prompt that matched
    answer: str | None = None
    answer_token_ids: tuple[int, ...] = ()
    similarity: float | None = None
    reason: str = ""  # why a semantic hit is verified instead of served (failed guards)
    meta: dict | None = None  # what the writer stored with the answer (e.g. generation seconds)

    def to_event(self) -> CacheEvent:
        return CacheEvent(outcome=self.outcome, matched_prompt=self.prompt, similarity=self.similarity,
                          reason=self.reason)


def _aside_path(directory: str) -> str:
    """``<dir>.corrupt-<timestamp>-<pid>``, with a counter when that name is taken."""
    base = f"{directory}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    return next(p for n in itertools.count() if not os.path.lexists(p := f"{base}-{n}" if n else base))


def _is_corruption(err: BaseException) -> bool:
    """'file is not a database', 'disk image is malformed'; not 'database is locked' (OperationalError)."""
    return isinstance(err, sqlite3.DatabaseError) and not isinstance(err, sqlite3.OperationalError)


class SemanticCache:
    """Exact + semantic prompt cache on disk. See the module docstring."""

    def __init__(self, directory: str | os.PathLike, embedder, *, threshold: float = DEFAULT_THRESHOLD,
                 mode: str = "verify", size_limit_bytes: int = DEFAULT_SIZE_LIMIT, ttl_s: float | None = None,
                 clock=time.time):
        """``clock`` (unix seconds) dates entries and decides their TTL; tests pass a fake one."""
        _check_mode_and_threshold(mode, threshold)
        if size_limit_bytes <= 0 or (ttl_s is not None and ttl_s <= 0):
            raise InvalidSettingError("cache size limit and TTL must be positive")
        self.directory, self.threshold, self.mode = os.fspath(directory), float(threshold), mode
        self.size_limit_bytes, self.ttl_s, self._clock = int(size_limit_bytes), ttl_s, clock
        self._embedder = embedder
        self._index, self._version = EmbeddingIndex(), None  # None: reload at the next sync
        self._counts: Counter = Counter()
        self._saved_s = 0.0
        self._lock = threading.RLock()  # one instance may serve several UI threads
        self._cache = self._open()
        self._call(self._sync)

    # ---- storage plumbing -------------------------------------------------------------------
    def _open(self) -> diskcache.Cache:
        def attempt() -> diskcache.Cache:
            cache = diskcache.Cache(self.directory, size_limit=self.size_limit_bytes,
                                    eviction_policy="least-recently-stored")
            cache.get(_VERSION_KEY)  # touch the database so that corruption shows now
            return cache
        try:
            return attempt()
        except (OSError, sqlite3.DatabaseError) as err:
            if isinstance(err, sqlite3.OperationalError) and "locked" in str(err):
                raise
            self._move_aside(err)
            return attempt()

    def _move_aside(self, err: BaseException) -> None:
        aside = _aside_path(self.directory)
        if os.path.lexists(self.directory):
            os.replace(self.directory, aside)
        message = f"semantic cache at {self.directory} was unreadable ({err}); moved to {aside}, starting empty"
        log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def _call(self, fn):
        """Run fn under the lock; on database corruption move the directory aside, reopen empty, rerun fn."""
        with self._lock:
            try:
                return fn()
            except sqlite3.DatabaseError as err:
                if not _is_corruption(err):
                    raise
                self._cache.close()
                self._move_aside(err)
                self._cache = self._open()
                self._index, self._version = EmbeddingIndex(), None
                return fn()

    def _get(self, key: str) -> dict | None:
        try:
            rec = self._cache.get(_PREFIX + key)
        except sqlite3.Error:
            raise
        except Exception as err:  # an entry that no longer unpickles: drop it, keep the cache
            log.warning("dropping unreadable cache entry %s: %s", key, err)
            self._cache.delete(_PREFIX + key)
            return None
        if rec is not None and self.ttl_s is not None and self._clock() - rec["created"] >= self.ttl_s:
            self._cache.delete(_PREFIX + key)  # expired by our clock (diskcache's expire uses the real one)
            return None
        return rec

    def _bump(self) -> bool:
        """Increment the shared version; True when no other process wrote since our last sync."""
        version = self._cache.incr(_VERSION_KEY, default=0)
        mine = self._version is not None and version == self._version + 1
        self._version = version if mine else None
        return mine

    def _sync(self) -> None:
        version = self._cache.get(_VERSION_KEY, 0)  # 0: nothing written yet
        if version != self._version:
            self._reload()
            self._version = version

    def _reload(self) -> None:
        index = EmbeddingIndex()
        for raw_key in self._cache.iterkeys():
            if isinstance(raw_key, str) and raw_key.startswith(_PREFIX):
                rec = self._get(raw_key[len(_PREFIX):])
                if rec is not None:
                    index.add(rec["scope"], raw_key[len(_PREFIX):], np.frombuffer(rec["embedding"], np.float32))
        self._index = index

    def _embed(self, text: str) -> np.ndarray:
        return normalise_rows(self._embedder.encode([text]))[0]  # (d,)

    # ---- public API ---------------------------------------------------------------------------
    def lookup(self, prompt: str, scope: str, mode: str | None = None, threshold: float | None = None) -> CacheHit:
        """``mode`` and ``threshold`` override the cache's defaults for this one lookup."""
        mode, threshold = mode or self.mode, self.threshold if threshold is None else float(threshold)
        _check_mode_and_threshold(mode, threshold)
        hit = self._call(lambda: self._lookup(prompt, scope, mode, threshold))
        self._counts[hit.outcome] += 1
        return hit

    def _lookup(self, prompt: str, scope: str, mode: str, threshold: float) -> CacheHit:
        if not normalise_prompt(prompt):
            return CacheHit("miss")
        key = entry_key(scope, prompt)
        rec = self._get(key)
        if rec is not None and rec["scope"] == scope:
            return _hit("exact", key, rec, 1.0)
        self._sync()
        for cand, sim in self._index.search(scope, self._embed(prompt)):
            if sim < threshold:
                break
            rec = self._get(cand)
            if rec is None or rec["scope"] != scope:  # evicted or expired since the last reload
                self._index.remove(cand)
                continue
            if mode == "verify":
                return _hit("verified", cand, rec, sim)
            reasons = failed_guards(rec["prompt"], prompt)
            return _hit("verified" if reasons else "cached", cand, rec, sim, "; ".join(reasons))
        return CacheHit("miss")

    def store(self, prompt: str, scope: str, answer: str, answer_token_ids, complete: bool,
              meta: dict | None = None) -> bool:
        """Store a finished answer. Refuses (False) cancelled/truncated answers and empty prompts."""
        if not complete or not normalise_prompt(prompt) or not (answer or answer_token_ids):
            return False
        key, vec = entry_key(scope, prompt), self._embed(prompt)
        rec = {"prompt": prompt, "scope": scope, "answer": answer,
               "answer_token_ids": [int(t) for t in answer_token_ids], "embedding": vec.astype(np.float32).tobytes(),
               "created": self._clock(), "meta": dict(meta or {})}

        def write() -> None:
            self._cache.set(_PREFIX + key, rec, expire=self.ttl_s, tag=_TAG)
            if self._bump():
                self._index.add(scope, key, vec)
        self._call(write)
        return True

    def delete(self, key: str) -> bool:
        def remove() -> bool:
            existed = self._cache.delete(_PREFIX + key)
            if self._bump():
                self._index.remove(key)
            return bool(existed)
        return self._call(remove)

    def clear(self) -> None:
        def wipe() -> None:
            self._cache.evict(_TAG)
            self._bump()
            self._index, self._version = EmbeddingIndex(), None
        self._call(wipe)

    def entries(self, limit: int = 50) -> list[dict]:
        """Newest first: key, prompt, answer preview, scope, created (unix seconds)."""
        def collect() -> list[dict]:
            self._expire()
            recs = []
            for raw_key in self._cache.iterkeys():
                if isinstance(raw_key, str) and raw_key.startswith(_PREFIX):
                    rec = self._get(raw_key[len(_PREFIX):])
                    if rec is not None:
                        recs.append({"key": raw_key[len(_PREFIX):], "prompt": rec["prompt"],
                                     "answer": rec["answer"][:120], "scope": rec["scope"], "created": rec["created"]})
            return sorted(recs, key=lambda r: -r["created"])[:limit]
        return self._call(collect)

    def _expire(self) -> None:
        self._cache.expire()
        if self.ttl_s is not None:  # reading an entry drops it once it is older than the TTL
            for raw_key in list(self._cache.iterkeys()):
                if isinstance(raw_key, str) and raw_key.startswith(_PREFIX):
                    self._get(raw_key[len(_PREFIX):])

    def __len__(self) -> int:
        """Live entries on disk. Also resyncs the index when TTL or the size limit removed entries."""
        def count() -> int:
            self._expire()
            n = sum(1 for k in self._cache.iterkeys() if isinstance(k, str) and k.startswith(_PREFIX))
            self._sync()
            if n != len(self._index):  # evicted or expired without a version bump
                self._version = None
                self._sync()
            return n
        return self._call(count)

    def record_saved(self, seconds: float) -> None:
        """The caller reports generation time that a hit saved."""
        self._saved_s += max(0.0, float(seconds))

    def stats(self) -> dict:
        hits = {o: self._counts[o] for o in OUTCOMES if o != "miss"}
        lookups = sum(self._counts.values())
        return {"lookups": lookups, "hits": hits, "misses": self._counts["miss"],
                "hit_rate": (lookups - self._counts["miss"]) / lookups if lookups else 0.0,
                "time_saved_s": self._saved_s, "entries": len(self)}

    def close(self) -> None:
        self._cache.close()

    def __enter__(self) -> SemanticCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _hit(outcome: str, key: str, rec: dict, sim: float, reason: str = "") -> CacheHit:
    return CacheHit(outcome, key, rec["prompt"], rec["answer"], tuple(rec["answer_token_ids"]), sim, reason,
                    rec.get("meta") or None)
