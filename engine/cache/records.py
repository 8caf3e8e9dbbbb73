"""One cache entry as a typed value, :class:`CacheRecord`, and its JSON wire format (both storage backends).

Nothing but JSON is ever stored or read (never pickle): a record read from disk or from a shared Redis may
have been written by another program. A record is checked in one place, its constructor
(``CacheRecord.__post_init__``): every field's type and shape, whoever builds it, from the JSON read back
(:meth:`CacheRecord.from_json`) or from an answer about to be stored (:meth:`CacheRecord.new`). Anything
else raises :class:`BadRecord`, and the caller skips such a record with a warning. What no reader accepts is
therefore never written.

Well-formed is not honest: whoever can write a shared store can write a wrong answer. With a secret the
instances share, each record carries ``mac``, an HMAC-SHA256 of its fields (:meth:`CacheRecord.mac_for`),
and a record whose ``mac`` does not check is refused (:meth:`CacheRecord.is_signed_by`).

The wire format (schema 1) is unchanged from the untyped records of earlier versions, so caches written
before still load and their signatures still check.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import hmac
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from engine.config import is_int

SCHEMA = 1
_SCOPE = re.compile(r"^[0-9a-f]{1,64}$|^[\w.:-]{1,128}$")
_MAX_TEXT = 1_000_000  # characters in a prompt or an answer
_MAX_TOKENS = 100_000
_SIGNED_FIELDS = ("schema", "prompt", "scope", "answer", "answer_token_ids", "created", "meta")


class BadRecord(ValueError):
    """A stored entry that is not a well-formed cache record."""


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise BadRecord(what)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _is_text(value) -> bool:
    """A str of at most _MAX_TEXT characters that UTF-8 can encode: JSON's ``\\ud800`` escape gives a lone
    surrogate, which would fail later, where the entry key or the signature encodes the prompt."""
    if not isinstance(value, str) or len(value) > _MAX_TEXT:
        return False
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True, eq=False)
class CacheRecord:
    """One stored answer. Constructing one checks it (the one validation); see the module docstring."""

    prompt: str
    scope: str  # engine.cache.keys.make_scope: target, precision, sampling, system prompt, earlier turns
    answer: str
    answer_token_ids: tuple[int, ...]
    embedding: np.ndarray  # (d,) float32, read-only: the prompt's unit vector
    created: float  # unix seconds, by the writer's clock
    meta: Mapping[str, float] = field(default_factory=dict)  # what the writer stored with it (generation seconds)
    mac: str = ""  # HMAC-SHA256 (hex) of the other fields; "" when unsigned
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        _need(self.schema == SCHEMA, f"unknown schema {self.schema!r}")
        for name in ("prompt", "answer"):
            _need(_is_text(getattr(self, name)), f"{name} is not text")
        _need(isinstance(self.scope, str) and bool(_SCOPE.match(self.scope)), "bad scope")
        ids = self.answer_token_ids
        _need(isinstance(ids, tuple) and len(ids) <= _MAX_TOKENS and all(is_int(t) and t >= 0 for t in ids),
              "answer_token_ids must be a list of non-negative integers")
        _need(_is_number(self.created), "bad created time")
        _need(isinstance(self.meta, Mapping) and all(isinstance(k, str) and _is_number(v)
                                                     for k, v in self.meta.items()), "meta must map names to numbers")
        vec = self.embedding
        _need(isinstance(vec, np.ndarray) and vec.dtype == np.float32 and vec.ndim == 1 and vec.size > 0,
              "embedding must be a non-empty (d,) float32 vector")
        _need(bool(np.isfinite(vec).all()), "embedding has non-finite values")
        _need(isinstance(self.mac, str), "mac must be text")

    # ---- building one ------------------------------------------------------------------------------
    @classmethod
    def new(cls, prompt: str, scope: str, answer: str, answer_token_ids, embedding, created: float,
            meta: Mapping | None = None) -> CacheRecord:
        """A record of a fresh answer: ids as ints, the embedding as float32, only the numeric ``meta``
        values kept. Raises BadRecord for what a reader would refuse (too long, a negative id, a NaN)."""
        return cls(prompt, scope, answer, tuple(int(t) for t in answer_token_ids), _frozen_vector(embedding),
                   float(created), {str(k): float(v) for k, v in (meta or {}).items() if isinstance(v, (int, float))})

    @classmethod
    def from_json(cls, text: str | bytes) -> CacheRecord:
        """Parse the wire format (JSON text, the embedding as base64 of little-endian float32); the
        constructor then checks the fields. Raises BadRecord."""
        rec = _json_object(text)
        ids = rec.get("answer_token_ids")
        return cls(prompt=rec.get("prompt"), scope=rec.get("scope"), answer=rec.get("answer"),
                   answer_token_ids=tuple(ids) if isinstance(ids, list) else ids,
                   embedding=_vector_from_base64(rec.get("embedding", "")), created=rec.get("created"),
                   meta=rec.get("meta", {}), mac=rec.get("mac", ""), schema=rec.get("schema"))

    def signed(self, secret: bytes) -> CacheRecord:
        """This record carrying its ``mac`` for ``secret``."""
        return dataclasses.replace(self, mac=self.mac_for(secret))

    # ---- reading one -------------------------------------------------------------------------------
    def to_json(self) -> str:
        """The wire format: compact JSON, keys in the order earlier versions wrote them."""
        wire = {"schema": self.schema, "prompt": self.prompt, "scope": self.scope, "answer": self.answer,
                "answer_token_ids": list(self.answer_token_ids), "embedding": _base64(self.embedding),
                "created": self.created, "meta": dict(self.meta)}
        if self.mac:
            wire["mac"] = self.mac
        return json.dumps(wire, ensure_ascii=False, separators=(",", ":"))

    def mac_for(self, secret: bytes) -> str:
        """HMAC-SHA256 (hex) of every field a reader uses, in a canonical form: the same bytes whoever wrote
        the JSON and however its keys were ordered."""
        fields = {name: getattr(self, name) for name in _SIGNED_FIELDS}
        fields.update(answer_token_ids=list(self.answer_token_ids), meta=dict(self.meta),
                      embedding=_base64(self.embedding))
        payload = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        return hmac.new(secret, payload, hashlib.sha256).hexdigest()

    def is_signed_by(self, secret: bytes) -> bool:
        """Whether the record carries a valid ``mac`` for ``secret`` (compared in constant time)."""
        return bool(self.mac) and hmac.compare_digest(self.mac, self.mac_for(secret))

    def check_vocab(self, vocab_size: int | None) -> None:
        """Token ids must index the model's vocabulary; raises BadRecord otherwise."""
        if vocab_size is not None and any(t >= vocab_size for t in self.answer_token_ids):
            raise BadRecord(f"token id {max(self.answer_token_ids)} is outside the vocabulary ({vocab_size})")


def _json_object(text) -> dict:
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise BadRecord(f"not UTF-8: {err}") from None
    _need(isinstance(text, str), f"expected JSON text, got {type(text).__name__}")
    try:
        rec = json.loads(text)
    except (ValueError, RecursionError) as err:
        raise BadRecord(f"not JSON: {err}") from None
    _need(isinstance(rec, dict), "not a JSON object")
    return rec


def _vector_from_base64(blob) -> np.ndarray:
    try:
        raw = base64.b64decode(blob, validate=True)
    except (binascii.Error, TypeError, ValueError) as err:
        raise BadRecord(f"embedding is not base64: {err}") from None
    _need(len(raw) > 0 and len(raw) % 4 == 0, "embedding has a bad length")
    return _frozen_vector(np.frombuffer(raw, dtype="<f4"))


def _frozen_vector(values) -> np.ndarray:
    vec = np.array(values, dtype=np.float32).reshape(-1)  # a copy: nothing outside shares it
    vec.setflags(write=False)
    return vec


def _base64(vec: np.ndarray) -> str:
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode("ascii")


def mask_url(url: str) -> str:
    """redis://user:secret@host:6379/0 -> redis://user:***@host:6379/0 (for logs and the UI)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit((parts.scheme, f"{user}:***@{host}{port}", parts.path, parts.query, parts.fragment))
    except ValueError:
        return "<unparseable cache URL>"
