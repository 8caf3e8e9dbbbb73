"""One cache entry as plain data: the JSON both storage backends hold, and its check on the way back in.

Nothing but JSON is ever stored or read (never pickle): a record read from disk or from a shared Redis may
have been written by another program, so :func:`decode_record` checks every field's type and shape and
raises :class:`BadRecord` for anything else. The caller skips such a record with a warning.

Well-formed is not honest: whoever can write a shared store can write a wrong answer. With a secret the
instances share, each record carries ``mac``, an HMAC-SHA256 of its fields (:func:`record_mac`), and a
record whose ``mac`` does not check is refused (:func:`signed_by`).
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import math
import re
from urllib.parse import urlsplit, urlunsplit

import numpy as np

from engine.config import is_int

SCHEMA = 1
_SCOPE = re.compile(r"^[0-9a-f]{1,64}$|^[\w.:-]{1,128}$")
_MAX_TEXT = 1_000_000  # characters in a prompt or an answer
_MAX_TOKENS = 100_000


class BadRecord(ValueError):
    """A stored entry that is not a well-formed cache record."""


def encode_record(prompt: str, scope: str, answer: str, answer_token_ids, embedding: np.ndarray,
                  created: float, meta: dict | None = None, secret: bytes | None = None) -> str:
    """The JSON text of one entry, signed when a ``secret`` is given. The embedding travels as base64 of
    little-endian float32. Raises BadRecord for an entry that :func:`decode_record` would refuse (too long,
    a negative token id, a non-finite embedding): what no reader accepts is never written."""
    vec = np.asarray(embedding, dtype="<f4").reshape(-1)
    rec = {"schema": SCHEMA, "prompt": prompt, "scope": scope, "answer": answer,
           "answer_token_ids": [int(t) for t in answer_token_ids],
           "embedding": base64.b64encode(vec.tobytes()).decode("ascii"), "created": float(created),
           "meta": {str(k): float(v) for k, v in (meta or {}).items() if isinstance(v, (int, float))}}
    if secret is not None:
        rec["mac"] = record_mac(decode_record(json.dumps(rec)), secret)
    text = json.dumps(rec, ensure_ascii=False, separators=(",", ":"))
    decode_record(text)
    return text


def record_mac(rec: dict, secret: bytes) -> str:
    """HMAC-SHA256 (hex) of every field a reader uses, in a canonical form rebuilt from the checked record: the
    same bytes whoever wrote the JSON and however its keys were ordered."""
    fields = {name: rec[name] for name in ("schema", "prompt", "scope", "answer", "answer_token_ids", "created",
                                           "meta")}
    fields["embedding"] = base64.b64encode(np.asarray(rec["embedding"], dtype="<f4").tobytes()).decode("ascii")
    payload = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
    return hmac.new(secret, payload, hashlib.sha256).hexdigest()


def signed_by(rec: dict, secret: bytes) -> bool:
    """Whether the record carries a valid ``mac`` for ``secret`` (compared in constant time)."""
    mac = rec.get("mac")
    return isinstance(mac, str) and hmac.compare_digest(mac, record_mac(rec, secret))


def _need(cond: bool, what: str) -> None:
    if not cond:
        raise BadRecord(what)


def decode_record(text) -> dict:
    """JSON text -> a checked record dict with ``embedding`` as a (d,) float32 array. Raises BadRecord."""
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
    _need(rec.get("schema") == SCHEMA, f"unknown schema {rec.get('schema')!r}")
    for name in ("prompt", "answer"):
        _need(isinstance(rec.get(name), str) and len(rec[name]) <= _MAX_TEXT, f"{name} is not text")
    _need(isinstance(rec.get("scope"), str) and bool(_SCOPE.match(rec["scope"])), "bad scope")
    ids = rec.get("answer_token_ids")
    _need(isinstance(ids, list) and len(ids) <= _MAX_TOKENS and all(is_int(t) and t >= 0 for t in ids),
          "answer_token_ids must be a list of non-negative integers")
    _need(isinstance(rec.get("created"), (int, float)) and math.isfinite(rec["created"]), "bad created time")
    meta = rec.get("meta", {})
    _need(isinstance(meta, dict) and all(isinstance(v, (int, float)) and math.isfinite(v) for v in meta.values()),
          "meta must map names to numbers")
    try:
        raw = base64.b64decode(rec.get("embedding", ""), validate=True)
    except (binascii.Error, TypeError, ValueError) as err:
        raise BadRecord(f"embedding is not base64: {err}") from None
    _need(len(raw) > 0 and len(raw) % 4 == 0, "embedding has a bad length")
    vec = np.frombuffer(raw, dtype="<f4").astype(np.float32)
    _need(bool(np.isfinite(vec).all()), "embedding has non-finite values")
    _need(isinstance(rec.get("mac", ""), str), "mac must be text")
    return {**rec, "embedding": vec, "meta": meta}


def check_vocab(rec: dict, vocab_size: int | None) -> None:
    """Token ids must index the model's vocabulary; raises BadRecord otherwise."""
    if vocab_size is not None and any(t >= vocab_size for t in rec["answer_token_ids"]):
        raise BadRecord(f"token id {max(rec['answer_token_ids'])} is outside the vocabulary ({vocab_size})")


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
