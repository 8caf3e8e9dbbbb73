"""Precision gguf converts nothing: the tokenizer and the config come from the GGUF file's header
(engine/models/gguf_meta.py, engine/models/gguf_header.py), the same as transformers builds them with gguf's own
reader, and a converter that would run fails the test."""
from __future__ import annotations

import struct

import pytest

from engine.errors import ModelFormatError
from engine.models import catalog
from engine.models.gguf_header import HeaderReader, header_reader
from engine.models.loading import load_model, load_tokenizer
from engine.models.sources import gguf_file
from tests.helpers.constants import SMOL

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("llama_cpp")]


@pytest.fixture(autouse=True)
def no_conversion(monkeypatch):
    """The converter fails the test if the gguf path calls it."""
    def refuse(*args, **kwargs):
        pytest.fail("precision gguf converted a GGUF to Hugging Face weights")
    monkeypatch.setattr(catalog, "convert_gguf", refuse)


def test_the_header_reader_gives_what_gguf_reads(tmp_path):
    """Every key's value and every tensor's name, as transformers parses them from gguf.GGUFReader."""
    from gguf import GGUFReader
    from transformers.modeling_gguf_pytorch_utils import read_field

    path = gguf_file(SMOL, tmp_path)
    ours, theirs = HeaderReader(path), GGUFReader(path)
    assert list(ours.fields) == list(theirs.fields)
    for key in theirs.fields:
        assert read_field(ours, key) == read_field(theirs, key), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]


def test_gguf_loads_with_the_files_tokenizer_and_config_and_nothing_converted(tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    loaded = load_model(SMOL, "gguf", cache_dir=tmp_path)
    path = gguf_file(SMOL, tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)  # gguf's own reader
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    assert loaded.config.to_dict() == config.to_dict()
    assert loaded.tokenizer.backend_tokenizer.to_str() == tokenizer.backend_tokenizer.to_str()
    assert loaded.tokenizer.chat_template == tokenizer.chat_template
    text = "def f(x):\n    return x ** 2  # héllo, 你好"
    assert loaded.tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"] == loaded.backend.tokenize(text, False)
    assert loaded.tokenizer("<|im_end|>")["input_ids"] == tokenizer("<|im_end|>")["input_ids"]
    assert not (tmp_path / "models").exists()  # no Hugging Face weights
    assert [p.name for p in (tmp_path / "gguf-meta").iterdir()]  # the small tokenizer+config folder, kept
    assert load_tokenizer(SMOL, tmp_path).get_vocab() == tokenizer.get_vocab()


def test_the_header_reader_is_lent_only_within_its_block(tmp_path):
    import gguf

    original = gguf.GGUFReader
    with header_reader():
        assert gguf.GGUFReader is not original
    assert gguf.GGUFReader is original


@pytest.mark.parametrize("damage", ["empty", "not gguf", "truncated"])
def test_a_damaged_header_is_a_format_error(tmp_path, damage):
    from engine.models.gguf_meta import gguf_tokenizer

    good = gguf_file(SMOL, tmp_path).read_bytes()[:4096]
    data = {"empty": b"", "not gguf": b"PK\x03\x04" + bytes(64), "truncated": good[:200]}[damage]
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(data)
    with pytest.raises((ModelFormatError, ValueError, struct.error)):
        HeaderReader(bad)
    with pytest.raises(ModelFormatError, match="bad.gguf"):
        gguf_tokenizer(bad, tmp_path)
