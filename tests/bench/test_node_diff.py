"""bench.speed.node_diff names the first node of llama.cpp's graph where a verify row stops being the token fed
alone, on the real SmolLM2 GGUF: flash attention's split-KV path with K and V of one type from 512 cached
positions, and nothing with the app's K f16 / V bf16 cache."""
from __future__ import annotations

import pytest

from tests.helpers.constants import SMOL

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("llama_cpp")]


def test_an_f16_v_cache_makes_flash_attention_the_first_node_that_differs_and_bf16_none(capsys):
    from bench.speed.node_diff import main

    main(["--model", SMOL, "--width", "4", "--position", "520", "--cache-v", "f16"])
    same_types = capsys.readouterr().out
    assert "first node that differs: " in same_types and "(FLASH_ATTN_EXT)" in same_types
    main(["--model", SMOL, "--width", "4", "--position", "520"])  # the app's K f16 / V bf16
    mixed = capsys.readouterr().out
    assert "K f16 V bf16" in mixed and "every node of the token's row is equal in both graphs" in mixed


def test_the_comparison_reads_every_layer_and_a_width_of_one_is_equal_to_itself():
    from bench.speed.node_diff import first_unequal_node
    from engine.backends.llama_cpp import GgufModel, GgufSettings
    from engine.models.sources import gguf_file

    gguf = GgufModel(gguf_file(SMOL), GgufSettings(n_ctx=256))
    ids = [(17 * i + 11) % 1000 + 100 for i in range(64)]
    same = first_unequal_node(gguf, gguf.n_vocab, ids, 24, 1)
    assert same.first is None and same.matched == same.nodes_compared > 30 * 10  # 30 layers, ~25 nodes each


def test_repacked_weights_that_crash_here_are_refused_with_why(monkeypatch):
    import bench.speed.node_diff as node_diff

    monkeypatch.setattr(node_diff, "repack_fault", lambda path: "llama.cpp died of SIGILL (planted)")
    with pytest.raises(SystemExit, match="--repack: llama.cpp died of SIGILL"):
        node_diff.main(["--model", SMOL, "--width", "2", "--position", "8", "--repack"])


@pytest.mark.parametrize("args, expected", [(["--width", "0"], "--width"), (["--cache-v", "f8"], "--cache-v")])
def test_the_node_diff_bench_refuses_bad_arguments(args, expected, capsys):
    from bench.speed.node_diff import main
    with pytest.raises(SystemExit) as exit_info:
        main(["--model", SMOL, *args])
    assert exit_info.value.code == 2 and expected in capsys.readouterr().err
