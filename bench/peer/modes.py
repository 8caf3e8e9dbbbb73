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
    """A bench mode (bench.speed.mode_runs' contract) asking a running llama-server for the same prompt tokens,
    greedy, same max tokens; a warm call lets the server keep and reuse its prompt (``cache_prompt``). A mode that
    keeps state across requests (``ngram-mod``'s n-gram table) has a ``forget`` the bench calls before each run.

    The server's timings put the first token inside ``prompt_ms`` and time the rest as ``predicted_ms``, so the
    time to first token is the client's seconds less ``predicted_ms`` (the HTTP round trip counts as waiting, as
    it does for a user), and the decode rate is the server's ``predicted_per_second`` (tokens after the first over
    ``predicted_ms``, as ours)."""
    def run(call) -> dict:
        engine = call.engine
        result = server.complete(engine.encode(call.messages), call.sampling.max_new_tokens, cache_prompt=call.warm)
        tokens = result["tokens"]
        end = next((i for i, t in enumerate(tokens) if t in engine.target.eos_ids), len(tokens))
        timings = result["timings"]
        drafted = timings.get("draft_n")  # absent when the server drafted nothing
        decoding = timings.get("predicted_n", 0) >= 2 and "predicted_ms" in timings
        return {"tokens": tokens[:end], "seconds": result["seconds"], "mean_accepted": None,
                "ttft_s": result["seconds"] - timings["predicted_ms"] / 1000 if "predicted_ms" in timings else None,
                "decode_tokens_per_s": timings.get("predicted_per_second") if decoding else None,
                "acceptance_rate": timings.get("draft_n_accepted", 0) / drafted if drafted else None,
                "server_tokens_per_s": timings.get("predicted_per_second"),
                "server_prompt_ms": timings.get("prompt_ms"), "server_prompt_cached": timings.get("cache_n")}
    if server.config.spec_type == "ngram-mod":  # its table outlives requests: each run starts it anew
        run.forget = server.restart
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
