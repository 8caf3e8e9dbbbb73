"""Server-side similarity search in Redis 8 vector sets (``VADD``/``VSIM``/``VREM``): the commands the
Redis store adds to its writes, and the orphan cleanup.

Layout under the namespace ``ns``, next to the records (see :mod:`engine.cache.redis_store`):

- ``ns:v:<scope>``: one vector set per scope (a lookup never crosses scopes, and a small scope is never
  searched through a large one); element = entry key, int8-quantised by default (``Q8``, 4x smaller than
  float32; :class:`VectorSettings`);
- ``ns:scope``: hash entry key -> scope, so that an evicted or expired entry's vector can be found.

Vector-set elements have no TTL. A record that expires leaves its vector behind until one of these removes
it, each atomically (a Lua script checks the record is still gone): a lookup that meets it (``forget``),
the incremental sweep that runs along with writes, and the full sweep that ``count`` runs. Writes and
deletes change record, order, hash and vector in one ``MULTI``, so they never diverge.

Scores: ``VSIM`` gives (1 + cosine) / 2 of the quantised vectors; :func:`similar` returns the cosine.
"""
from __future__ import annotations

import base64
import json
from dataclasses import dataclass

import numpy as np
import redis
from redis.commands.vectorset.commands import QuantizationOptions

from engine.errors import InvalidSettingError

# HNSW exploration factor of an insert: 100 inserts twice as fast as the default 200 (on 2 busy cores), and
# lookups at EF >= 50 still found what the exact scan finds on every eval pair; at 40 they did not, even at
# EF 800 (bench.cache.evaluate --exactness, docs/cache.md). CAS lets the server search the neighbours in a thread.
BUILD_EF = 100
LINKS = 16  # HNSW M, Redis's default: links per node (memory and insert time grow with it, recall too)
QUANTISATIONS = {"q8": QuantizationOptions.Q8, "noquant": QuantizationOptions.NOQUANT, "bin": QuantizationOptions.BIN}


@dataclass(frozen=True)
class VectorSettings:
    """How a vector set is built: insert EF, links per node (M) and the stored vectors' quantisation (int8 ``q8``:
    4x smaller than float32 ``noquant``). A set keeps the quantisation it was made with; the bench varies these
    (bench/cache/recall.py)."""
    build_ef: int = BUILD_EF
    links: int = LINKS
    quantization: str = "q8"

    def __post_init__(self):
        if self.quantization not in QUANTISATIONS:
            raise InvalidSettingError(f"vector quantisation must be one of {', '.join(QUANTISATIONS)}, "
                                      f"got {self.quantization!r}")
        for name in ("build_ef", "links"):
            value = getattr(self, name)
            if not (isinstance(value, int) and 2 <= value <= 4096):
                raise InvalidSettingError(f"vector-set {name} must be an integer in 2-4096, got {value!r}")


SWEEP_CHUNK = 200  # hash fields checked per sweep step (a step runs every 100 writes)
# drop each (key, vector set) pair whose record is gone: KEYS = hash, order, then entry key and vector set
# per element; ARGV = the elements
_FORGET = """
local n = 0
for i = 1, #ARGV do
  if redis.call('EXISTS', KEYS[2 * i + 1]) == 0 then
    redis.call('VREM', KEYS[2 * i + 2], ARGV[i])
    redis.call('HDEL', KEYS[1], ARGV[i])
    redis.call('ZREM', KEYS[2], ARGV[i])
    n = n + 1
  end
end
return n
"""


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def has_vector_sets(client) -> bool:
    """Whether the server knows ``VADD`` (Redis 8, or the vectorset module); asked once per store."""
    try:
        client.vset().vcard("speclens-probe")  # a read of a key that need not exist: 0 when supported
        return True
    except redis.ResponseError:  # unknown command, or an ACL without the vector-set commands
        return False


class VectorSets:
    """The vector-set commands of one namespace. ``k(*parts)`` makes the namespace's key names."""

    def __init__(self, k, settings: VectorSettings = VectorSettings()):
        self.k, self.settings = k, settings
        self.scopes = k("scope")
        self._forget = None
        self._sweep_cursor = 0

    def vset(self, scope: str) -> str:
        return self.k("v", scope)

    def add(self, pipe, key: str, text: str) -> None:
        """Queue the vector of record ``text`` (JSON, checked as a CacheRecord) on ``pipe``."""
        try:
            rec = json.loads(text)
            scope, blob = rec["scope"], base64.b64decode(rec["embedding"])  # little-endian float32: VADD's FP32
        except (ValueError, TypeError, KeyError):
            return  # not a cache record: stored as text, never found by similarity (and moved aside when read)
        pipe.hset(self.scopes, key, scope)
        built = self.settings
        pipe.vset().vadd(self.vset(scope), blob, key, cas=True, quantization=QUANTISATIONS[built.quantization],
                         ef=built.build_ef, numlinks=built.links)

    def remove(self, pipe, pairs: list[tuple[str, str | None]]) -> None:
        """Queue removing the vectors of (entry key, scope) pairs; scope None: the entry had no vector."""
        for key, scope in pairs:
            if scope is not None:
                pipe.vset().vrem(self.vset(scope), key)
                pipe.hdel(self.scopes, key)

    def scopes_of(self, c, keys: list[str]) -> list[str | None]:
        return [None if s is None else _text(s) for s in c.hmget(self.scopes, keys)] if keys else []

    def similar(self, c, scope: str, query: np.ndarray, count: int, ef: int) -> list[tuple[str, float]]:
        """The ``count`` nearest entry keys of ``scope`` by HNSW, best first, with their (approximate) cosine."""
        # the raw command: redis-py 8.1's vset().vsim(with_scores=True) fails on the empty reply of a missing set;
        # its reply parser still gives a dict element -> score when there are results
        found = c.execute_command("VSIM", self.vset(scope), "FP32", np.asarray(query, dtype="<f4").tobytes(),
                                  "WITHSCORES", "COUNT", int(count), "EF", int(ef))
        pairs = found.items() if isinstance(found, dict) else zip(found[::2], found[1::2])
        return [(_text(key), 2.0 * float(score) - 1.0) for key, score in pairs]

    def forget(self, c, pairs: list[tuple[str, str]]) -> int:
        """Remove the vectors of (entry key, scope) pairs whose record is gone; how many were removed."""
        if not pairs:
            return 0
        if self._forget is None:
            self._forget = c.register_script(_FORGET)
        keys = [self.scopes, self.k("order")]
        for key, scope in pairs:
            keys += [self.k("e", key), self.vset(scope)]
        return int(self._forget(keys=keys, args=[key for key, _ in pairs]))

    def sweep_step(self, c, chunk: int = SWEEP_CHUNK) -> int:
        """Check the next ``chunk`` entries of the hash; the cursor wraps around. Removed orphans."""
        self._sweep_cursor, found = c.hscan(self.scopes, self._sweep_cursor, count=chunk)
        pairs = [(_text(key), _text(scope)) for key, scope in found.items()]
        with c.pipeline(transaction=False) as p:
            for key, _ in pairs:
                p.exists(self.k("e", key))
            alive = p.execute() if pairs else []
        return self.forget(c, [pair for pair, live in zip(pairs, alive) if not live])

    def sweep(self, c) -> int:
        """A whole pass over the hash; how many orphans were removed."""
        self._sweep_cursor, removed = 0, self.sweep_step(c)
        while self._sweep_cursor != 0:
            removed += self.sweep_step(c)
        return removed

    def drop_all(self, c, chunk: int) -> None:
        keys = list(c.scan_iter(match=self.k("v", "*"), count=chunk)) + [self.scopes]
        for i in range(0, len(keys), chunk):
            c.delete(*keys[i:i + chunk])
