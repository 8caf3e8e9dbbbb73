"""The real-text recall bench: prose pieces from Python sources, the embedded corpus made once, the vector-set
settings it varies, and a whole measurement on a real Redis 8 with the real MiniLM embedder."""
import json

import numpy as np
import pytest

from bench.cache import recall
from bench.cache.corpus import _pieces, embedded_corpus, text_pieces
from engine.cache.embedder import HashEmbedder
from engine.cache.redis_vectors import VectorSettings
from engine.errors import InvalidSettingError

SOURCE = '''"""A module about parsing configuration files. It reads sections and keys from plain text files."""

def load(path):
    """Open the file at path and return every section it defines. Missing files raise an error.

    >>> load("x.ini")
    {}
    """
    # read the whole file first, then split it into sections by their
    # bracketed headers, keeping the order in which they appear
    return {}
'''


def _tree(tmp_path):
    (tmp_path / "pkg").mkdir(parents=True)
    (tmp_path / "pkg" / "config.py").write_text(SOURCE)
    (tmp_path / "pkg" / "copy.py").write_text(SOURCE)  # the same text again: no duplicate pieces
    (tmp_path / "pkg" / "broken.py").write_text("def (:\n")
    return tmp_path


def test_pieces_are_the_prose_of_docstrings_and_comments_once_each(tmp_path):
    pieces = text_pieces(100, roots=[_tree(tmp_path)], progress=False)
    assert "Open the file at path and return every section it defines. Missing files raise an error." in pieces
    assert any(p.startswith("read the whole file first, then split it") and "appear" in p for p in pieces)
    assert not any(">>>" in p or "{}" == p for p in pieces)
    assert len(pieces) == len(set(pieces)) == 3
    assert text_pieces(2, roots=[tmp_path], progress=False) == pieces[:2]


def test_long_paragraphs_split_into_prompt_sized_pieces():
    sentence = "This sentence has exactly eight words in it. "
    pieces = list(_pieces(sentence * 20))
    assert len(pieces) > 1 and all(len(p) <= 240 for p in pieces)


def test_the_embedded_corpus_is_made_once_and_read_back(tmp_path, monkeypatch):
    roots = [_tree(tmp_path / "src")]
    monkeypatch.setattr("bench.cache.corpus.source_roots", lambda: roots)
    path = tmp_path / "corpus.npz"
    texts, vectors = embedded_corpus(3, path, HashEmbedder(16), progress=False)
    assert vectors.shape == (3, 16) and np.allclose(np.linalg.norm(vectors, axis=1), 1)

    class Refuses:
        def encode(self, texts):
            raise AssertionError("embedded again")
    again, same = embedded_corpus(2, path, Refuses(), progress=False)
    assert again == texts[:2] and np.array_equal(same, vectors[:2])


@pytest.mark.parametrize("kwargs", [{"quantization": "fp16"}, {"links": 1}, {"build_ef": "100"}])
def test_vector_settings_are_checked_where_they_are_defined(kwargs):
    with pytest.raises(InvalidSettingError):
        VectorSettings(**kwargs)


def test_the_recall_cli_refuses_bad_arguments_in_one_line(capsys):
    with pytest.raises(SystemExit) as stop:
        recall.main(["--cache-url", "redis://127.0.0.1:1/0", "--pairs", "tests/data/paraphrases.jsonl",
                     "--quantization", "q8", "--links", "1"])
    assert stop.value.code == 2 and "links" in capsys.readouterr().err


@pytest.mark.real
@pytest.mark.parametrize("quantization", ["q8", "noquant"])
def test_a_recall_run_on_real_text_and_a_real_redis_8(redis_server, tmp_path, monkeypatch, quantization):
    if redis_server.kind != "redis8":
        pytest.skip("vector sets only")
    monkeypatch.setattr(recall, "SAMPLE", 50)
    monkeypatch.setattr(recall, "MISSES", 20)
    out = tmp_path / "report.json"
    pairs = "tests/data/paraphrases.jsonl"
    assert recall.main(["--cache-url", redis_server.url, "--pairs", pairs, "--distractors", "400", "--ef", "50,200",
                        "--quantization", quantization, "--corpus", str(tmp_path / "corpus.npz"),
                        "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["entries"] == 400 and report["settings"]["quantization"] == quantization
    assert report["search"].endswith("vector set")
    for row in report["by_ef"].values():
        assert row["self_recall"] == 1.0 and row["same"] == report["pairs"]  # 400 entries: HNSW is exact here
    assert not list(redis_server.client().scan_iter(match="speclens-scale-*"))  # throw-away namespaces dropped
