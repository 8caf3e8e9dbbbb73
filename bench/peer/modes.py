"""The bench's llama.cpp modes: one llama-server (bench.peer.server) per mode, asked for the same prompt tokens."""
from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from engine.models.catalog import model_gguf
from bench.peer.server import INSTALL_HINT, LlamaServer, ServerConfig, find_llama_server

# mode -> llama-server's --spec-type: plain, the draft GGUF (draft-simple), n-gram lookup in the context (ngram-mod)
PEER_MODES: dict[str, str | None] = {"llama-cpp": None, "llama-cpp-spec": "draft-simple",
                                     "llama-cpp-ngram": "ngram-mod"}


def llama_cpp_mode(server: LlamaServer) -> Callable:
    """A bench mode asking a running llama-server for the same prompt tokens, greedy, same max tokens."""
    def run(engine, messages, sampling, spec, item) -> dict:
        result = server.complete(engine.encode(messages), sampling.max_new_tokens)
        tokens = result["tokens"]
        end = next((i for i, t in enumerate(tokens) if t in engine.target.eos_ids), len(tokens))
        timings = result["timings"]
        drafted = timings.get("draft_n")  # absent when the server drafted nothing
        return {"tokens": tokens[:end], "seconds": result["seconds"], "mean_accepted": None,
                "acceptance_rate": timings.get("draft_n_accepted", 0) / drafted if drafted else None,
                "server_tokens_per_s": timings.get("predicted_per_second")}
    return run


def peer_config(mode: str, binary: Path, target_gguf: Path, draft_gguf: Path | None, threads: int) -> ServerConfig:
    """The llama-server configuration of a peer mode (the draft GGUF only where the mode drafts with it)."""
    spec_type = PEER_MODES[mode]
    return ServerConfig(binary, target_gguf, spec_type, draft_gguf if spec_type == "draft-simple" else None, threads)


def start_peers(stack: ExitStack, modes: list[str], target: str, draft: str, binary: str | None, *,
                threads: int) -> dict:
    """Start one llama-server per requested peer mode, on ``threads`` threads (the bench passes torch's, so both
    sides get the same); returns {mode: runner}. Drops (and says why) the peer modes that cannot run here."""
    wanted = [m for m in modes if m in PEER_MODES]
    if not wanted:
        return {}
    found = find_llama_server(binary)
    target_gguf, draft_gguf = model_gguf(target), model_gguf(draft)
    why = (f"no llama-server found ({INSTALL_HINT})" if found is None else
           f"the target {target!r} has no GGUF file" if target_gguf is None else None)
    runners = {}
    for mode in wanted:
        if why is None and PEER_MODES[mode] == "draft-simple" and draft_gguf is None:
            print(f"[bench] skipping {mode}: the draft {draft!r} has no GGUF file", flush=True)
        elif why is None:
            print(f"[bench] starting llama-server for {mode} (--spec-type {PEER_MODES[mode] or 'none'}, {threads} "
                  f"threads): {found}", flush=True)
            server = LlamaServer(peer_config(mode, found, target_gguf, draft_gguf, threads))
            runners[mode] = llama_cpp_mode(stack.enter_context(server))
        else:
            print(f"[bench] skipping {mode}: {why}", flush=True)
        if mode not in runners:
            modes.remove(mode)
    return runners
