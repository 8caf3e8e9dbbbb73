"""Time outside the model forwards: what Python, sampling, verification and detokenising add to each step.

python -m bench.speed.overhead [--target NAME] [--draft NAME] [--dtype auto] [--draft-dtype auto]
                         [--modes target,default] [--max-new-tokens 64] [--prompts FILE.jsonl] [--json OUT]

Each model's backend times its forwards (``Backend.forward_clock``: torch from a forward's call to its logits,
llama.cpp, precision gguf, inside its ``llama_decode`` calls); the rest of each generation's wall time is overhead.
Printed per mode: steps, ms per step, ms of forwards per step, ms outside them per step, and that share of the step
(the bar: under 10% for torch, under 5% for llama.cpp). ``--json OUT`` writes the same rows as numbers, for a reader
that should not parse the table (the header's precision note takes as many lines as the machine needs).
"""
from __future__ import annotations

import argparse
import json
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass

from bench.cli import arguments_checked, read_jsonl
from engine.chat_engine import ChatEngine
from engine.surface import EngineSurface
from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig, check_precision
from engine.events import final_done
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.loading import quiet_library_logs
from engine.models.sources import check_source

HEADER = f"{'mode':<10} {'steps':>6} {'ms/step':>10} {'forwards ms':>12} {'outside ms':>13} {'outside':>8}"
PROMPTS = ("Write a Python function that returns the n-th Fibonacci number.",
           "Explain what a hash map is in two sentences.")


@dataclass(frozen=True)
class Overhead:
    mode: str
    steps: int
    seconds: float
    forward_s: float

    @property
    def share(self) -> float:
        return 1 - self.forward_s / self.seconds if self.seconds else 0.0

    def per_step_ms(self) -> dict[str, float]:
        """The table's columns as numbers: milliseconds per step in all, inside the forwards and outside them."""
        per = 1e3 / max(self.steps, 1)
        return {"ms_per_step": self.seconds * per, "forward_ms_per_step": self.forward_s * per,
                "outside_ms_per_step": (self.seconds - self.forward_s) * per}

    def record(self) -> dict:
        """One row of ``--json``: the measured totals, the per-step columns and the share outside (0..1)."""
        return {**asdict(self), **self.per_step_ms(), "outside_share": self.share}

    def row(self) -> str:
        ms = self.per_step_ms()
        return (f"{self.mode:<10} {self.steps:>6} {ms['ms_per_step']:>10.1f} {ms['forward_ms_per_step']:>12.1f} "
                f"{ms['outside_ms_per_step']:>13.2f} {self.share:>8.1%}")


@contextmanager
def forward_clock(*backends):
    """Seconds spent inside the forwards of the models these backends run (a one-item list, read after the block):
    each backend times its own (``Backend.forward_clock``: torch from a forward's call to its logits, llama.cpp
    inside ``llama_decode``); a model in both roles is timed once."""
    total = [0.0]
    with ExitStack() as stack:
        for backend in dict.fromkeys(backends):  # equal backends: the same model
            stack.enter_context(backend.forward_clock(total))
        yield total


def measure(engine: EngineSurface, prompts: list[str], modes: list[str], max_new_tokens: int) -> list[Overhead]:
    sampling = SamplingConfig(max_new_tokens=max_new_tokens)
    runs = {"target": lambda m: engine.generate_reference(m, sampling),
            "default": lambda m: engine.generate(m, sampling, DEFAULT_SPEC, cache=CACHE_OFF)}
    rows = []
    for mode in modes:
        final_done(runs[mode]([{"role": "user", "content": "Say hello."}]))  # warm-up
        steps, seconds, forward_s = 0, 0.0, 0.0
        for prompt in prompts:
            with forward_clock(engine.target.backend, engine.draft.backend) as inside:
                start = time.perf_counter()
                done = final_done(runs[mode]([{"role": "user", "content": prompt}]))
                seconds += time.perf_counter() - start
            steps += done.stats.acceptance.steps
            forward_s += inside[0]
        rows.append(Overhead(mode, steps, seconds, forward_s))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.overhead", description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft-dtype", default="auto")
    parser.add_argument("--modes", default="target,default", help="target and/or default")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", help="JSONL with a prompt per line (default: two built-in prompts)")
    parser.add_argument("--json", metavar="OUT", help="also write the rows here, as numbers")
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or set(modes) - {"target", "default"}:
            raise ValueError(f"--modes takes target and/or default, not {args.modes!r}")
        SamplingConfig(max_new_tokens=args.max_new_tokens)
        for precision in (args.dtype, args.draft_dtype):
            check_precision(precision)
        for name in (args.target, args.draft):
            check_source(name)
        prompts = [p["prompt"] for p in read_jsonl(args.prompts, ("prompt",))] if args.prompts else list(PROMPTS)
    quiet_library_logs()
    engine = ChatEngine(measure_beside=False)
    info = engine.load_pair(args.target, args.draft, args.dtype, args.draft_dtype)
    print(f"target {info.target} ({info.target_precision}), draft {info.draft} ({info.draft_precision}); "
          f"{info.precision_note}", flush=True)
    print(HEADER)
    rows = measure(engine, prompts, modes, args.max_new_tokens)
    for row in rows:
        print(row.row(), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"target": info.target, "draft": info.draft, "precision_note": info.precision_note,
                       "rows": [row.record() for row in rows]}, f, indent=1)


if __name__ == "__main__":
    main()
