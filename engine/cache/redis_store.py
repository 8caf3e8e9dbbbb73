"""The shared cache store: a Redis server that many app instances read and write.

Layout under a namespace ``ns`` (one per deployment; two teams can share a server without seeing each
other's entries):

- ``ns:e:<entry key>``: the record, JSON text (see :mod:`engine.cache.records`); TTL is Redis expiry
- ``ns:order``: sorted set entry key -> time stored; beyond ``max_entries`` the oldest are evicted
- ``ns:quarantine:<entry key>``: malformed records, moved aside for a person to look at

The similarity search runs where the server allows, decided once, at the first connection:

- Redis 8 (vector sets): on the server, one vector set per scope (:mod:`engine.cache.redis_vectors`); an
  instance holds no embeddings;
- older servers (Debian's Redis 7.0): an in-memory index in each instance, kept in step through
  ``ns:log``, a capped stream of changes (``op`` put/del/clear, ``key``): each instance applies the changes
  since the last id it saw (or reloads all after a gap).

No call waits long on a dead server: 0.5 s socket timeouts, no retries inside redis-py, and after a failure
every call fails at once (StoreUnreachable: no answer; StoreUnavailable: refused) until ``retry_after_s`` passed.
"""
from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator

import numpy as np
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from engine.cache.records import BadRecord, CacheRecord, mask_url
from engine.cache.redis_vectors import VectorSets, VectorSettings, has_vector_sets
from engine.cache.store import Change, StoreUnavailable, StoreUnreachable, Token
from engine.errors import InvalidSettingError

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "speclens"
DEFAULT_MAX_ENTRIES = 100_000
SOCKET_TIMEOUT_S = 0.5
RETRY_AFTER_S = 2.0
LOG_MAXLEN = 10_000
_CHUNK = 1000
_NAMESPACE = re.compile(r"^[\w.-]{1,64}$")
_EMPTY = "0-0"
SWEEP_EVERY = 100  # writes between two incremental orphan sweeps (vector sets)
# The server cannot be used now: unreachable, too slow or refusing our password (ConnectionError covers
# AuthenticationError and BusyLoadingError), or refusing the command (out of memory, a read-only replica, no
# ACL permission). Anything else redis-py raises (DataError, other ResponseErrors) is a bug and propagates.
_UNREACHABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)
_REFUSING = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError, redis.exceptions.NoPermissionError)


def _stream_id(token: str) -> tuple[int, int]:
    ms, _, seq = str(token).partition("-")
    return int(ms), int(seq or 0)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisStore:
    """Cache records in Redis. See the module docstring."""

    shared = True  # every instance with the URL writes here: records are trusted only when signed

    def __init__(self, url: str, namespace: str = DEFAULT_NAMESPACE, max_entries: int = DEFAULT_MAX_ENTRIES,
                 retry_after_s: float = RETRY_AFTER_S, clock=time.monotonic, timeout_s: float = SOCKET_TIMEOUT_S,
                 vectors: VectorSettings = VectorSettings()):
        """Connects lazily: a server that is down is StoreUnavailable at the first call, not here. A bad
        namespace or URL is InvalidSettingError (the message masks the password). ``timeout_s`` and
        ``vectors`` (how the vector sets are built) are for bulk loads such as the bench."""
        if not _NAMESPACE.match(namespace):
            raise InvalidSettingError(f"cache namespace must be 1-64 letters, digits, '_', '.', '-', got {namespace!r}")
        if max_entries < 1:
            raise InvalidSettingError("max_entries must be positive")
        self.namespace, self.max_entries, self.retry_after_s = namespace, int(max_entries), float(retry_after_s)
        self.location = f"{mask_url(url)} (namespace {namespace})"
        try:
            self._secret = redis.connection.parse_url(url).get("password") or None
            self._client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                                socket_connect_timeout=timeout_s, retry=Retry(NoBackoff(), 0),
                                                retry_on_timeout=False, decode_responses=False)
        except ValueError as err:  # redis-py's URL parsing: a bad port, scheme or query option
            raise InvalidSettingError(f"bad cache URL {mask_url(url)}: {err}") from None
        self._clock, self._retry_at, self._down, self._failure = clock, float("-inf"), "", StoreUnavailable
        self._vectors: VectorSets | None = None  # set at the first connection when the server has vector sets
        self._vector_settings = vectors
        self.search = ""  # which search path runs, once connected
        self._writes = 0

    def _k(self, *parts: str) -> str:
        return ":".join((self.namespace, *parts))

    def _run(self, fn):
        """fn(client); a server that cannot be used -> StoreUnavailable, and fail fast until the back-off passed."""
        if self._clock() < self._retry_at:
            raise self._failure(self._down)
        try:
            if not self.search:
                self._detect(self._client)
            return fn(self._client)
        except (*_UNREACHABLE, *_REFUSING) as err:
            detail = f"{type(err).__name__}: {err}"
            if self._secret:
                detail = detail.replace(self._secret, "***")
            self._failure = StoreUnreachable if isinstance(err, _UNREACHABLE) else StoreUnavailable
            state = "unreachable" if self._failure is StoreUnreachable else "refusing commands"
            self._down = f"Redis at {self.location} {state} ({detail}); retrying every {self.retry_after_s:g} s"
            self._retry_at = self._clock() + self.retry_after_s
            raise self._failure(self._down) from err

    def _detect(self, c) -> None:
        """Which search path runs, asked once; logged and kept in ``search``."""
        version = _text(c.info("server").get("redis_version", "?"))
        if has_vector_sets(c):
            self._vectors = VectorSets(self._k, self._vector_settings)
            self.search = f"Redis {version} vector set"
        else:
            self.search = f"Redis {version}: in-memory index"
        log.info("semantic cache at %s: %s", self.location, self.search)

    def _decode(self, c, key: str, raw) -> CacheRecord | None:
        if raw is None:
            return None
        try:
            return CacheRecord.from_json(raw)
        except BadRecord as err:
            log.warning("semantic cache: malformed entry %s in %s moved aside: %s", key, self.location, err)
            scopes = self._vectors.scopes_of(c, [key]) if self._vectors else [None]
            with c.pipeline() as p:
                p.rename(self._k("e", key), self._k("quarantine", key)).zrem(self._k("order"), key)
                if self._vectors:
                    self._vectors.remove(p, [(key, scopes[0])])
                p.execute(raise_on_error=False)
            return None

    def _log(self, p, op: str, key: str) -> None:
        """Queue a change for the instances' in-memory indexes; none exist on the vector-set path."""
        if self._vectors is None:
            p.xadd(self._k("log"), {"op": op, "key": key}, maxlen=LOG_MAXLEN, approximate=True)

    def _gone(self, c, keys: list[str]) -> None:
        """Entries whose record is gone (expired, moved aside): out of the order, their vectors removed."""
        if self._vectors:
            pairs = [(k, s) for k, s in zip(keys, self._vectors.scopes_of(c, keys)) if s is not None]
            self._vectors.forget(c, pairs)
        if keys:
            c.zrem(self._k("order"), *keys)

    # ---- the store verbs (engine.cache.store.Store) ------------------------------------------------
    def get(self, key: str) -> CacheRecord | None:
        def read(c):
            try:
                raw = c.get(self._k("e", key))
            except redis.ResponseError as err:  # WRONGTYPE: something that is not a string sits there
                raw = f"<{err}>"
            return self._decode(c, key, raw)
        return self._run(read)

    def put(self, key: str, text: str, ttl_s: float | None, after: Token | None) -> Token | None:
        self.put_many([(key, text)], ttl_s)
        return None  # Redis does not tell whether another instance wrote in between: the log will

    def put_many(self, items: list[tuple[str, str]], ttl_s: float | None, atomic: bool = True) -> None:
        """Store (entry key, record text) pairs in one ``MULTI``: record, order and vector together.
        ``atomic=False`` (bulk loads): a plain pipeline, which lets Redis insert vectors in its threads (about
        twice as fast); a connection lost mid-way may then leave a vector without its record, until the sweep."""
        def write(c):
            with c.pipeline(transaction=atomic) as p:
                for key, text in items:
                    p.set(self._k("e", key), text, px=int(ttl_s * 1000) if ttl_s else None)
                    p.zadd(self._k("order"), {key: time.time()})
                    if self._vectors:
                        self._vectors.add(p, key, text)
                    self._log(p, "put", key)
                p.zcard(self._k("order"))
                size = p.execute()[-1]
            if size > self.max_entries:
                self._evict(c, size - self.max_entries)
            self._writes += len(items)
            if self._vectors and self._writes >= SWEEP_EVERY:  # expired entries' vectors, a chunk at a time
                self._writes = 0
                self._vectors.sweep_step(c)
        self._run(write)

    def _evict(self, c, n: int) -> None:
        oldest = [_text(k) for k, _ in c.zpopmin(self._k("order"), n)]  # atomic: no two instances evict twice
        scopes = self._vectors.scopes_of(c, oldest) if self._vectors else []
        with c.pipeline() as p:
            for key in oldest:
                p.delete(self._k("e", key))
                self._log(p, "del", key)
            if self._vectors:
                self._vectors.remove(p, list(zip(oldest, scopes)))
            p.execute()

    def delete(self, key: str, after: Token | None) -> tuple[bool, Token | None]:
        def remove(c):
            scopes = self._vectors.scopes_of(c, [key]) if self._vectors else []
            with c.pipeline() as p:
                p.delete(self._k("e", key)).zrem(self._k("order"), key)
                self._log(p, "del", key)
                if self._vectors:
                    self._vectors.remove(p, [(key, scopes[0])])
                existed = p.execute()[0]
            return bool(existed), None
        return self._run(remove)

    def clear(self) -> None:
        def wipe(c):
            batch = []
            for k in c.scan_iter(match=self._k("e", "*"), count=_CHUNK):
                batch.append(k)
                if len(batch) >= _CHUNK:
                    c.delete(*batch)
                    batch = []
            if batch:
                c.delete(*batch)
            c.delete(self._k("order"))
            if self._vectors:
                self._vectors.drop_all(c, _CHUNK)
            c.xadd(self._k("log"), {"op": "clear", "key": ""}, maxlen=LOG_MAXLEN, approximate=True)
        self._run(wipe)

    def drop(self) -> None:
        """Delete every key of this namespace, change log included (throw-away namespaces, e.g. evaluation)."""
        def drop(c):
            keys = list(c.scan_iter(match=self._k("*"), count=_CHUNK))
            for i in range(0, len(keys), _CHUNK):
                c.delete(*keys[i:i + _CHUNK])
        self._run(drop)

    def records(self) -> Iterator[tuple[str, CacheRecord]]:
        def collect(c):
            keys = [_text(k) for k in c.zrange(self._k("order"), 0, -1)]
            out, gone = [], []
            for i in range(0, len(keys), _CHUNK):
                chunk = keys[i:i + _CHUNK]
                for key, raw in zip(chunk, c.mget([self._k("e", k) for k in chunk])):
                    rec = self._decode(c, key, raw)
                    (out.append((key, rec)) if rec is not None else gone.append(key))
            self._gone(c, gone)
            return out
        return iter(self._run(collect))

    def count(self) -> int:
        """Live records. On the vector-set path also a full orphan sweep (both are one pass over the entries)."""
        def count(c):
            if self._vectors:
                self._vectors.sweep(c)
                return c.hlen(self._vectors.scopes)
            keys = [_text(k) for k in c.zrange(self._k("order"), 0, -1)]
            return sum(c.exists(*[self._k("e", k) for k in keys[i:i + _CHUNK]]) for i in range(0, len(keys), _CHUNK))
        return self._run(count)

    # ---- server-side search (vector sets) ------------------------------------------------------------
    def server_search(self) -> bool:
        """Whether the server searches (Redis 8 vector sets); connects if not yet. StoreUnavailable when down."""
        self._run(lambda c: None)
        return self._vectors is not None

    def similar(self, scope: str, query: np.ndarray, count: int, ef: int) -> list[tuple[str, float]]:
        """``count`` nearest (entry key, approximate cosine) in ``scope`` (HNSW, int8), best first."""
        return self._run(lambda c: self._vectors.similar(c, scope, query, count, ef))

    def get_many(self, keys: list[str]) -> list[CacheRecord | None]:
        def read(c):
            raws = c.mget([self._k("e", k) for k in keys]) if keys else []
            return [self._decode(c, key, raw) for key, raw in zip(keys, raws)]
        return self._run(read)

    def forget(self, scope: str, keys: list[str]) -> int:
        """Remove the vectors of entries whose record is gone (a lookup met them); how many were removed."""
        return self._run(lambda c: self._vectors.forget(c, [(k, scope) for k in keys]))

    def changes(self, since: Token | None) -> tuple[Token, list[Change] | None]:
        """Changes after stream id ``since``; None (reload all) after a gap, a clear, or a restarted server."""
        def read(c):
            last = c.xrevrange(self._k("log"), count=1)
            token = _text(last[0][0]) if last else _EMPTY
            if since is None:
                return token, None
            if token == since:
                return token, []
            first = c.xrange(self._k("log"), count=1)
            if not first or _stream_id(_text(first[0][0])) > _stream_id(since):
                return token, None  # trimmed past what we saw, or the server lost its data
            entries = c.xrange(self._k("log"), min=f"({since}", max=token, count=LOG_MAXLEN)
            ops = [(_text(f.get(b"op", b"")), _text(f.get(b"key", b""))) for _, f in entries]
            if any(op == "clear" for op, _ in ops):
                return token, None
            return token, ops
        return self._run(read)

    def close(self) -> None:
        self._client.close()
