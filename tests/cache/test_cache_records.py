"""The typed cache record: one validation in its constructor, the JSON wire format unchanged (caches written
before still load and their signatures still check), and a frozen value."""
import dataclasses
import json

import numpy as np
import pytest

from engine.cache.embedder import HashEmbedder
from engine.cache.records import BadRecord, CacheRecord

SECRET = b"0123456789abcdef-shared-secret"
SCOPE = "test-scope"
# Written by the untyped records of commit move24 (encode_record("What is a list?", SCOPE, "A sequence.", [5, 7],
# [0.5, -0.25, 1.0], 1700000000.5, {"seconds": 2.5, "note": "not a number"}, SECRET)): it must still read the same.
OLD_TEXT = ('{"schema":1,"prompt":"What is a list?","scope":"test-scope","answer":"A sequence.",'
            '"answer_token_ids":[5,7],"embedding":"AAAAPwAAgL4AAIA/","created":1700000000.5,'
            '"meta":{"seconds":2.5},"mac":"f2d0e83c9c9f5b39a99fd2a0a84964745d47b2aab4a14fd9dc61e876328bed49"}')


def fresh(**changes) -> CacheRecord:
    rec = CacheRecord.new("What is a list?", SCOPE, "A sequence.", [5, 7], [0.5, -0.25, 1.0], 1700000000.5,
                          {"seconds": 2.5, "note": "not a number"})
    return dataclasses.replace(rec, **changes)


def fields(rec: CacheRecord) -> dict:
    return {f.name: getattr(rec, f.name) for f in dataclasses.fields(rec) if f.name != "embedding"}


def test_a_record_written_before_the_typed_record_still_loads_and_checks():
    rec = CacheRecord.from_json(OLD_TEXT)
    assert (rec.prompt, rec.answer, rec.answer_token_ids, rec.created) == \
        ("What is a list?", "A sequence.", (5, 7), 1700000000.5)
    assert np.array_equal(rec.embedding, np.array([0.5, -0.25, 1.0], dtype=np.float32))
    assert dict(rec.meta) == {"seconds": 2.5} and rec.is_signed_by(SECRET)
    assert rec.to_json() == OLD_TEXT  # byte for byte: what the old reader reads
    assert fresh().signed(SECRET).to_json() == OLD_TEXT


def test_the_wire_format_round_trips():
    vec = HashEmbedder(16).encode(["x"])[0]
    rec = CacheRecord.new("p", SCOPE, "a \u00e9\u4e2d", [1, 2], vec, 3.0, {"seconds": 1.5, "junk": object()})
    text = rec.to_json()
    wire = json.loads(text)
    assert list(wire) == ["schema", "prompt", "scope", "answer", "answer_token_ids", "embedding", "created", "meta"]
    assert wire["meta"] == {"seconds": 1.5} and wire["answer_token_ids"] == [1, 2] and "\u4e2d" in text
    back = CacheRecord.from_json(text.encode("utf-8"))
    assert fields(back) == fields(rec) and np.array_equal(back.embedding, vec)
    assert back.to_json() == text


@pytest.mark.parametrize("changes, problem", [
    (dict(prompt=5), "prompt is not text"),
    (dict(answer=None), "answer is not text"),
    (dict(scope="no spaces allowed"), "bad scope"),
    (dict(answer_token_ids=[1, 2]), "answer_token_ids"),  # a list, not the tuple the type says
    (dict(answer_token_ids=(1, -2)), "answer_token_ids"),
    (dict(answer_token_ids=(1, True)), "answer_token_ids"),  # a bool is not a token id
    (dict(answer_token_ids=(1.0,)), "answer_token_ids"),
    (dict(created="yesterday"), "bad created time"),
    (dict(created=float("nan")), "bad created time"),
    (dict(meta={"seconds": "2.5"}), "meta"),
    (dict(meta=[("seconds", 2.5)]), "meta"),
    (dict(embedding=np.zeros(3, dtype=np.float64)), "embedding"),
    (dict(embedding=np.zeros((1, 3), dtype=np.float32)), "embedding"),
    (dict(embedding=[0.5, 0.5]), "embedding"),
    (dict(embedding=np.array([0.5, np.inf], dtype=np.float32)), "non-finite"),
    (dict(mac=None), "mac must be text"),
    (dict(schema=2), "unknown schema"),
])
def test_a_field_of_the_wrong_type_is_refused_by_the_record_itself(changes, problem):
    with pytest.raises(BadRecord, match=problem):
        fresh(**changes)


@pytest.mark.parametrize("text, problem", [
    (b"\xff\xfe", "not UTF-8"),
    ("[1, 2]", "not a JSON object"),
    ("{", "not JSON"),
    (OLD_TEXT.replace('"embedding":"AAAAPwAAgL4AAIA/"', '"embedding":"not base64!"'), "not base64"),
    (OLD_TEXT.replace('"embedding":"AAAAPwAAgL4AAIA/"', '"embedding":"AAAA"'), "bad length"),
    (OLD_TEXT.replace('"answer_token_ids":[5,7]', '"answer_token_ids":"57"'), "answer_token_ids"),
    (OLD_TEXT.replace('"prompt":"What is a list?",', ''), "prompt is not text"),
    (OLD_TEXT.replace("What is a list?", "What is a list?\\ud800"), "prompt is not text"),  # a lone surrogate
    (12, "expected JSON text"),
])
def test_malformed_wire_text_is_refused(text, problem):
    with pytest.raises(BadRecord, match=problem):
        CacheRecord.from_json(text)


def test_a_record_is_frozen_and_so_is_its_embedding():
    rec = fresh()
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.answer = "something else"
    with pytest.raises(ValueError):
        rec.embedding[0] = 9.0


def test_a_signature_checks_only_for_its_secret_and_its_fields():
    signed = fresh().signed(SECRET)
    assert signed.is_signed_by(SECRET) and not fresh().is_signed_by(SECRET)
    assert not signed.is_signed_by(b"another-secret-of-16+bytes")
    assert not dataclasses.replace(signed, answer="a planted answer").is_signed_by(SECRET)
    assert not CacheRecord.from_json(signed.to_json().replace("A sequence.", "A planted.")).is_signed_by(SECRET)


def test_token_ids_must_fit_the_vocabulary():
    fresh().check_vocab(8)
    fresh().check_vocab(None)
    with pytest.raises(BadRecord, match="outside the vocabulary"):
        fresh().check_vocab(7)
