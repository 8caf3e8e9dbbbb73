"""Semantic cache in front of the engine: exact tier, semantic tier, guards; storage in a local directory or Redis.

A lookup never crosses scopes (target model, precision, sampling, system prompt, earlier turns) and never
serves a confident wrong answer: in ``verify`` mode every hit goes to the target as a draft: a near one
(``verified``), and an exact one too (``exact`` with ``needs_check``: served only when the target accepts
every token, see engine.serve.generation.check_hit); in ``direct`` mode an exact hit is served as is and a near one
(``cached``) only when every guard passes, and only from a store it trusts (engine/cache/trust.py).

Storage is a :class:`engine.cache.store.Store` (diskcache directory or a shared Redis). The semantic search
(:mod:`engine.cache.search`) runs on a Redis 8 server (vector sets), or else in this instance's memory, kept
up to date with what the store says changed since its last look: each lookup first catches up with the store's
change log (``Index.refresh``), so another process's or another machine's writes show up at the next lookup.
Entries the store drops on its own (TTL, the size limit) log no change; :meth:`SemanticCache.refresh` finds those
by counting the store, which costs a pass over it, so it runs at ``stats()``, not at every lookup (a lookup
skips and forgets a stale candidate it meets). When the store is
unreachable a lookup is a miss with the reason, a store is skipped, and ``stats().warning`` says why;
generation never waits on it. Only :class:`StoreUnavailable` is handled so; any other error is a bug and
propagates.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from engine.config import DEFAULT_CACHE, CacheConfig
from engine.cache.embedder import normalise_rows
from engine.errors import InvalidSettingError
from engine.events import CacheEvent
from engine.cache.stores import open_store
from engine.cache.disk_store import DEFAULT_SIZE_LIMIT
from engine.cache.guards import failed_guards, judge_decides
from engine.cache.records import BadRecord, CacheRecord
from engine.cache.search import SERVER_EF, Index, check_search, fits, index_for
from engine.cache.stats import CacheEntry, CacheStats
from engine.cache.store import Store, StoreUnavailable, StoreUnreachable
from engine.cache.keys import entry_key, make_scope, normalise_prompt
from engine.cache.trust import Trust, check_secret

__all__ = ["OUTCOMES", "CacheHit", "SemanticCache", "entry_key", "make_scope", "normalise_prompt"]

log = logging.getLogger(__name__)

OUTCOMES = ("exact", "verified", "cached", "miss")


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
    needs_check: bool = False  # an exact hit the target checks first (``reason`` says why): serve.generation.check_hit
    refuted: bool = False  # the target checked this exact hit and disagreed: dropped unless replaced

    def to_event(self) -> CacheEvent:
        return CacheEvent(outcome=self.outcome, matched_prompt=self.prompt, similarity=self.similarity,
                          reason=self.reason)


class SemanticCache:
    """Exact + semantic prompt cache over a store (local directory or Redis). See the module docstring."""

    def __init__(self, store: Store | str | os.PathLike, embedder, *, config: CacheConfig = DEFAULT_CACHE,
                 size_limit_bytes: int = DEFAULT_SIZE_LIMIT, ttl_s: float | None = None, clock=time.time,
                 secret: str | bytes | None = None, search: str = "auto", ef: int = SERVER_EF):
        """``store``: a :class:`Store`, a ``redis://`` URL or a directory (:func:`open_store`). ``config``: the
        mode and threshold of a lookup that names none (a CacheConfig checked its values when it was made).
        ``search``, ``ef``: see :func:`engine.cache.search.index_for` ("memory" forces the exact in-memory scan).
        ``clock`` (unix seconds) dates entries and, besides the store's own expiry, decides their TTL on read;
        tests pass a fake one. ``secret`` (shared by every instance of the cache) signs each record and
        refuses those that do not check (engine/cache/trust.py)."""
        if size_limit_bytes <= 0 or (ttl_s is not None and ttl_s <= 0):
            raise InvalidSettingError("cache size limit and TTL must be positive")
        secret = check_secret(secret)
        check_search(search, ef)
        self.config, self.ttl_s, self._clock = config, ttl_s, clock
        self._search, self._ef = search, ef
        self._store = store if isinstance(store, Store) else open_store(store, size_limit_bytes=size_limit_bytes)
        self.location = self._store.location
        self._trust = Trust(secret, self._store.shared)
        self._embedder = embedder
        self._dim = getattr(embedder, "dim", None) or len(self._embed("dimension probe"))
        self._index: Index | None = None  # chosen once the store answers (index_for)
        self._counts: Counter = Counter()
        self._saved_s = 0.0
        self._problems: dict[str, StoreUnavailable] = {}  # "read"/"write" -> the last failure of that kind, until over
        self._lock = threading.RLock()  # one instance may serve several UI threads
        self._safely("open", lambda: self._ready().refresh(), None)

    # ---- plumbing -------------------------------------------------------------------------------
    _WRITES = ("store", "delete", "clear")

    @property
    def problem(self) -> str:
        """Why the store failed lately ("" when healthy); shown in stats() and the cache panel. A write that failed
        because the server did not answer is over once any verb reaches it; any other failed write stays until a
        write succeeds (a read succeeding says nothing about a full disk)."""
        return "; ".join(dict.fromkeys(map(str, self._problems.values())))

    def _safely(self, what: str, fn, fallback):
        """fn under the lock. An unavailable store gives ``fallback`` and a warning, never an exception."""
        kind = "write" if what in self._WRITES else "read"
        with self._lock:
            try:
                result = fn()
            except StoreUnavailable as err:
                if str(self._problems.get(kind, "")) != str(err):
                    log.warning("semantic cache %s failed: %s", what, err)
                self._problems[kind] = err
                if self._index is not None:
                    self._index.invalidate()  # reload everything once the store is back
                return fallback
            # over: this kind's failure, every failure after a write succeeds, and any failure of a server that did
            # not answer (it answers now)
            self._problems = {} if kind == "write" else {
                k: err for k, err in self._problems.items() if k != kind and not isinstance(err, StoreUnreachable)}
            return result

    @property
    def search(self) -> str:
        """Where the semantic search runs ("Redis 8.2.3 vector set", "Redis 7.0.15: in-memory index", "in-memory
        index"); "" until the store has answered once."""
        return self._index.description if self._index is not None else ""

    def _ready(self) -> Index:
        if self._index is None:
            self._index = index_for(self._store, self._dim, self._search, self._ef)
        return self._index

    def _embed(self, text: str) -> np.ndarray:
        return normalise_rows(self._embedder.encode([text]))[0]  # (d,)

    def _expired(self, rec: CacheRecord) -> bool:
        """Older than the TTL by our clock (the store's own expiry runs on the real one)."""
        return self.ttl_s is not None and self._clock() - rec.created >= self.ttl_s

    def _believed(self, key: str, rec: CacheRecord) -> bool:
        """Live by our clock, and trusted: under its own prompt's key and, with a secret, signed."""
        return not self._expired(rec) and self._trust.believes(key, rec, entry_key(rec.scope, rec.prompt))

    def _usable(self, key: str, rec: CacheRecord | None, scope: str, vocab_size: int | None) -> bool:
        if rec is None or rec.scope != scope or not fits(key, rec, self._dim) or not self._believed(key, rec):
            return False
        try:
            rec.check_vocab(vocab_size)
        except BadRecord as err:
            log.warning("semantic cache: entry %s skipped: %s", key, err)
            return False
        return True

    # ---- public API ---------------------------------------------------------------------------
    def lookup(self, prompt: str, scope: str, config: CacheConfig | None = None, vocab_size: int | None = None,
               judge=None) -> CacheHit:
        """``config`` (the cache's own when None) sets this lookup's mode and threshold; mode "off" looks up
        nothing (a miss). Entries whose token ids fall outside ``vocab_size`` are skipped.
        ``judge(cached_prompt, prompt) -> bool`` may serve a direct-mode hit that the lexical guards would send to
        verification (see engine/cache/judge.py)."""
        config = config or self.config
        if config.mode == "off":
            return CacheHit("miss", reason="cache is off")
        hit = self._safely("lookup", lambda: self._lookup(prompt, scope, config.mode, config.threshold, vocab_size,
                                                          judge), None)
        if hit is None:
            hit = CacheHit("miss", reason=f"cache unavailable, answering without it: {self.problem}")
        with self._lock:
            self._counts[hit.outcome] += 1
        return hit

    def _lookup(self, prompt: str, scope: str, mode: str, threshold: float, vocab_size, judge) -> CacheHit:
        if not normalise_prompt(prompt):
            return CacheHit("miss")
        key = entry_key(scope, prompt)
        rec = self._store.get(key)
        untrusted = "" if mode == "verify" else self._trust.unverified_reason  # direct mode, store not trusted
        if self._usable(key, rec, scope, vocab_size):
            why = "verify mode: the target checks the cached answer" if mode == "verify" else untrusted
            return _hit("exact", key, rec, 1.0, why, needs_check=bool(why))
        index = self._ready()
        index.refresh()  # catch up with the store's change log: other instances' writes
        for cand, sim, rec in index.search(scope, self._embed(prompt), threshold):
            if sim < threshold:
                break
            rec = rec or self._store.get(cand)
            if not self._usable(cand, rec, scope, vocab_size):  # evicted, expired or unusable
                index.removed(cand, None)
                continue
            if mode == "verify" or untrusted:
                return _hit("verified", cand, rec, sim, untrusted)
            reasons = failed_guards(rec.prompt, prompt)
            if judge is not None and judge_decides(rec.prompt, prompt, reasons) and judge(rec.prompt, prompt):
                return _hit("cached", cand, rec, sim, "the paraphrase judge overruled: " + "; ".join(reasons))
            return _hit("verified" if reasons else "cached", cand, rec, sim, "; ".join(reasons))
        return CacheHit("miss")

    def store(self, prompt: str, scope: str, answer: str, answer_token_ids, complete: bool,
              meta: dict | None = None) -> bool:
        """Store a finished answer. Refuses (False) cancelled/truncated answers, empty prompts, and text that
        cannot be a record (e.g. lone surrogates). A failed write (store down, disk full or read-only: the
        store's StoreUnavailable) is logged and shown in stats(), and gives False; a bug raises."""
        if not complete or not normalise_prompt(prompt) or not (answer or answer_token_ids):
            return False
        key, vec = entry_key(scope, prompt), self._embed(prompt)
        try:
            record = CacheRecord.new(prompt, scope, answer, answer_token_ids, vec, self._clock(), meta)
            text = (record.signed(self._trust.secret) if self._trust.secret is not None else record).to_json()
        except BadRecord as err:
            log.warning("semantic cache: answer not stored: %s", err)
            return False

        def write() -> bool:
            index = self._ready()
            index.wrote(scope, key, vec, self._store.put(key, text, self.ttl_s, index.token))
            return True
        return self._safely("store", write, False)

    def delete(self, key: str) -> bool:
        def remove() -> bool:
            index = self._ready()
            existed, token = self._store.delete(key, index.token)
            index.removed(key, token)
            return existed
        return self._safely("delete", remove, False)

    def clear(self) -> None:
        def wipe() -> None:
            self._store.clear()
            self._ready().invalidate()
        self._safely("clear", wipe, None)

    def entries(self, limit: int = 50) -> list[CacheEntry]:
        """Newest first, the answers as a preview; only entries a lookup could use (live and trusted)."""
        def collect() -> list[CacheEntry]:
            found = [CacheEntry(k, r.prompt, r.answer[:120], r.created, r.scope)
                     for k, r in self._store.records() if self._believed(k, r)]
            return sorted(found, key=lambda e: -e.created)[:limit]
        return self._safely("listing", collect, [])

    def __len__(self) -> int:
        """Live entries in the store. Only counts: the index is left as it is (see :meth:`refresh`)."""
        return self._safely("count", self._store.count, 0)

    def refresh(self) -> int:
        """Bring the index fully up to date with the store, and give the store's live entry count: besides
        the logged changes a lookup catches up with, this finds the entries TTL or the size limit removed
        without a log entry (they make the count differ from the index). Costs a pass over the store."""
        def sync() -> int:
            live = self._store.count()
            self._ready().refresh(live)
            return live
        return self._safely("refresh", sync, 0)

    def record_saved(self, seconds: float) -> None:
        """The caller reports generation time that a hit saved."""
        with self._lock:
            self._saved_s += max(0.0, float(seconds))

    def stats(self) -> CacheStats:
        """The counters since this instance opened, and the store's live entries (after :meth:`refresh`)."""
        entries = self.refresh()
        with self._lock:
            counts, saved_s = Counter(self._counts), self._saved_s
        lookups = sum(counts.values())
        return CacheStats(entries=entries, lookups=lookups, hits={o: counts[o] for o in OUTCOMES if o != "miss"},
                          misses=counts["miss"], hit_rate=(lookups - counts["miss"]) / lookups if lookups else 0.0,
                          time_saved_s=saved_s, warning=self.problem, backend=self.location, search=self.search)

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> SemanticCache:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _hit(outcome: str, key: str, rec: CacheRecord, sim: float, reason: str = "",
         needs_check: bool = False) -> CacheHit:
    return CacheHit(outcome, key, rec.prompt, rec.answer, rec.answer_token_ids, sim, reason,
                    dict(rec.meta) or None, needs_check)
