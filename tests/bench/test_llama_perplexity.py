"""llama.cpp's llama-perplexity on the SmolLM2 GGUF (bench/peer/perplexity.py). Skips without the binary,
unless SPECLENS_REQUIRE_PEER=1 (tests/conftest.py)."""
import codecs
import random
import this  # the Zen of Python, rot13-encoded in the standard library

import pytest

from bench.peer.perplexity import llama_perplexity, parse_perplexity
from bench.peer.server import PeerError
from engine.models.catalog import model_gguf
from tests.helpers.constants import SMOL
from tests.helpers.peer import crashing_with_repack

ZEN = codecs.decode(this.s, "rot13")  # about 190 SmolLM2 tokens
CONTEXT = 64  # llama-perplexity needs 2 * CONTEXT tokens
THREADS = 1  # 2 threads spinning on 2 busy cores run 4x slower than one


def test_a_log_without_a_final_estimate_parses_to_none():
    assert parse_perplexity("perplexity: you need at least 128 tokens to evaluate perplexity") is None


@pytest.mark.real
def test_natural_text_is_less_perplexing_than_the_same_words_shuffled(llama_perplexity_binary, tmp_path):
    words = ZEN.split()
    random.Random(0).shuffle(words)
    natural, shuffled = tmp_path / "zen.txt", tmp_path / "shuffled.txt"
    natural.write_text(ZEN)
    shuffled.write_text(" ".join(words))
    gguf = model_gguf(SMOL)
    plain = llama_perplexity(gguf, natural, context=CONTEXT, threads=THREADS, binary=str(llama_perplexity_binary))
    mixed = llama_perplexity(gguf, shuffled, context=CONTEXT, threads=THREADS, binary=str(llama_perplexity_binary))
    assert plain.chunks >= 2 and mixed.chunks >= 2
    assert 1 < plain.ppl < mixed.ppl and plain.plus_minus > 0


@pytest.mark.real
def test_a_text_too_short_for_the_context_is_a_clear_error(llama_perplexity_binary, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("Beautiful is better than ugly.")
    with pytest.raises(PeerError, match="you need at least"):
        llama_perplexity(model_gguf(SMOL), short, context=CONTEXT, threads=THREADS, binary=str(llama_perplexity_binary))


@pytest.mark.real
def test_a_binary_that_crashes_with_repacked_weights_runs_again_without(llama_perplexity_binary, tmp_path, capsys):
    """Where llama.cpp's repacked kernels crash, llama-perplexity runs again with --no-repack and says so."""
    binary = crashing_with_repack(llama_perplexity_binary, tmp_path)
    text = tmp_path / "zen.txt"
    text.write_text(ZEN)
    result = llama_perplexity(model_gguf(SMOL), text, context=CONTEXT, threads=THREADS, binary=str(binary))
    assert result.chunks >= 2 and result.ppl > 1
    assert "llama-perplexity died of SIGILL with repacked weights" in capsys.readouterr().out
