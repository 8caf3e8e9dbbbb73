"""One prepared check of a CUDA machine, one line per check:

    python scripts/gpu_smoke.py [--target NAME] [--draft NAME]

versions and the device; auto choice and memory; runner invariants; the logits of one position fed with 1, 5 and
9 rows (differences in rounding steps, per precision); greedy speculative against target-only on 5 prompts (every
divergence within rounding); seeded sampling; the judge; calibration against CUDA-event timings; target-only
against speculative tok/s for bf16 and nf4; 20 requests and a pair switch without memory growth; launch.py
--no-browser with one /v1 completion. Without a CUDA GPU it says so, lists what it skipped and exits 0 (CI runs
it that way: tests/backends/test_device_runtime.py). Exits 1 when a check fails.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

CHECKS = ("auto choice and memory", "runner invariants", "logits at 1/5/9 rows", "greedy spec vs reference",
          "seeded sampling", "judge", "calibration vs CUDA events", "tok/s bf16 and nf4",
          "20 requests and a pair switch", "launch.py /v1")
PROMPTS = ("Write a Python function that checks whether a number is prime.",
           "Explain the difference between TCP and UDP in two sentences.",
           "Rename the variable x to total in: x = 0\nfor i in range(10):\n    x += i\nprint(x)",
           "List five HTTP status codes and what they mean.",
           "Write a bash one-liner that counts the lines of every .py file in a folder.")
MB = 2**20


def check_auto(ctx):
    from engine.models.devices import gpu_memory
    from engine.models.auto import plan_precisions
    free, total = gpu_memory(ctx.device)
    plan = plan_precisions({"target": (ctx.target, None), "draft": (ctx.draft, None)}, ctx.device)
    return f"{plan.precisions} ({plan.reason}); {free / 2**30:.1f} of {total / 2**30:.1f} GiB free"


def check_runner(ctx):
    from engine.models.loading import runner_for
    runner = runner_for(ctx.engine.target)
    ids = ctx.ids(40)
    logits = runner.forward(ids[:10], n_logits=3)
    assert runner.cache_len() == len(runner.tokens) == 10 and logits.shape[0] == 3
    assert logits.device.type == "cuda" and logits.dtype.is_floating_point, logits.device
    runner.rollback(6)
    runner.forward(ids[6:9])
    assert runner.cache_len() == len(runner.tokens) == 9
    return "cache length == tokens consumed after forward and rollback; logits stay on cuda"


def check_rows(ctx):
    import torch
    from engine.precision import rounding_step
    from engine.models.loading import load_model, runner_for
    ids, parts = ctx.ids(40), []
    for precision in ("bf16", "nf4"):
        loaded = load_model(ctx.target, precision, device=ctx.device)
        runner = runner_for(loaded)
        rows = {}
        for n in (1, 5, 9):
            runner.reset()
            runner.forward(ids[:30 - n])
            rows[n] = runner.forward(ids[30 - n:30], n_logits=1)[-1]
        step = rounding_step(precision, float(rows[1].abs().max()))
        steps = {n: float((rows[n] - rows[1]).abs().max()) / step for n in (5, 9)}
        same = bool(torch.equal(rows[5].argmax(), rows[1].argmax()) and torch.equal(rows[9].argmax(), rows[1].argmax()))
        parts.append(f"{precision}: 5 rows {steps[5]:.1f} steps, 9 rows {steps[9]:.1f} steps, argmax same={same}")
        del loaded, runner
    return "; ".join(parts)


def check_greedy(ctx):
    from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig
    from engine.events import final_done
    sampling, identical, notes = SamplingConfig(max_new_tokens=96), 0, []
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        ref = list(final_done(ctx.engine.generate_reference(messages, sampling)).token_ids)
        spec = list(final_done(ctx.engine.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF)).token_ids)
        if ref == spec:
            identical += 1
            continue
        div = ctx.engine.explain_divergence(messages, ref, spec)
        assert div.within_rounding, f"divergence beyond rounding: {div.to_dict()}"
        notes.append(f"at {div.position} margin {div.top2_margin:.3f} (step {div.rounding_step:.3f})")
    return f"{identical}/5 identical" + (f"; ties within rounding: {', '.join(notes)}" if notes else "")


def check_sampling(ctx):
    from engine.config import CACHE_OFF, SamplingConfig, SpecConfig
    from engine.events import final_done
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, seed=7, max_new_tokens=48)
    runs = [final_done(ctx.engine.generate([{"role": "user", "content": PROMPTS[3]}], sampling, SpecConfig(k=4),
                                           cache=CACHE_OFF)).token_ids for _ in range(2)]
    assert runs[0] == runs[1] and runs[0], "the same seed gave different answers"
    return f"seed 7 twice: the same {len(runs[0])} tokens"


def check_judge(ctx):
    from engine.cache.judge import judge_for
    judge = judge_for(ctx.engine.target)
    if judge is None:
        return f"{ctx.engine.target.name} has no calibrated judge threshold: nothing to check"
    same = judge.result("How do I reverse a list in Python?", "What's the way to reverse a Python list?")
    other = judge.result("How do I reverse a list in Python?", "How do I sort a list in Python?")
    assert same.p_yes > other.p_yes, (same, other)
    return f"paraphrase P(yes)={same.p_yes:.2f} (same={same.same}), other question P(yes)={other.p_yes:.2f}"


def check_calibration(ctx):
    import torch
    from engine.models.loading import runner_for
    costs, ids = ctx.engine.info().costs, ctx.ids(40)
    runner = runner_for(ctx.engine.target)
    runner.forward(ids[:16])
    measured = {}
    for n in (1, 8):
        times = []
        for _ in range(5):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            runner.forward(ids[16:16 + n], n_logits=n)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
            runner.rollback(16)
        measured[n] = sorted(times)[2]
    predicted = {n: costs.verify_fixed_s + costs.verify_per_token_s * n for n in (1, 8)}
    ratios = {n: predicted[n] / measured[n] for n in (1, 8)}
    assert all(0.33 < r < 3 for r in ratios.values()), (predicted, measured)
    return ", ".join(f"n={n}: calibrated {predicted[n] * 1e3:.1f} ms, CUDA events {measured[n] * 1e3:.1f} ms"
                     for n in (1, 8))


def check_speed(ctx):
    from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig
    from engine.events import final_done
    sampling, messages, parts = SamplingConfig(max_new_tokens=128), [{"role": "user", "content": PROMPTS[2]}], []
    for precision in ("bf16", "nf4"):
        ctx.engine.load_pair(ctx.target, ctx.draft, precision, None)
        rates = []
        for run in (lambda: ctx.engine.generate_reference(messages, sampling),
                    lambda: ctx.engine.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF)):
            final_done(run())  # warm-up
            start = time.perf_counter()
            rates.append(len(final_done(run()).token_ids) / (time.perf_counter() - start))
        parts.append(f"{precision}: target-only {rates[0]:.1f} tok/s, spec {rates[1]:.1f} tok/s "
                     f"({rates[1] / rates[0]:.2f}x)")
    ctx.engine.load_pair(ctx.target, ctx.draft)
    return "; ".join(parts)


def check_memory(ctx):
    import gc
    import torch
    from engine.config import SamplingConfig, SpecConfig
    from engine.events import final_done
    messages, sampling = [{"role": "user", "content": PROMPTS[1]}], SamplingConfig(max_new_tokens=32)
    final_done(ctx.engine.generate(messages, sampling, SpecConfig(k=4)))
    gc.collect()
    before = torch.cuda.memory_allocated()
    for i in range(20):
        final_done(ctx.engine.generate([{"role": "user", "content": f"{PROMPTS[i % 5]} ({i})"}], sampling,
                                       SpecConfig(k=4)))
    after_requests = torch.cuda.memory_allocated()
    ctx.engine.load_pair(ctx.target, ctx.draft, "nf4", "nf4")
    ctx.engine.load_pair(ctx.target, ctx.draft)
    gc.collect()
    after_switch = torch.cuda.memory_allocated()
    growth = (max(after_requests, after_switch) - before) / MB
    assert growth < 64, f"memory grew by {growth:.0f} MiB"
    return (f"allocated {before / MB:.0f} MiB, after 20 requests {after_requests / MB:.0f} MiB, after a switch "
            f"and back {after_switch / MB:.0f} MiB")


def check_launch(ctx):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, str(REPO / "launch.py"), "--no-browser", "--port", str(port),
                             "--target", ctx.target, "--draft", ctx.draft], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line.strip())
            if "serving on" in line:
                break
        precision = next((line for line in lines if "precision:" in line), "")
        body = json.dumps({"model": "x", "temperature": 0, "max_tokens": 16,
                           "messages": [{"role": "user", "content": "Say hello."}]}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                         {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=300))
        text = reply["choices"][0]["message"]["content"]
        assert text.strip(), reply
        return f"{precision} -> /v1 answered {text[:40]!r}"
    finally:
        proc.terminate()
        proc.wait(timeout=60)


class Context:
    def __init__(self, target: str, draft: str):
        import torch
        from engine.chat_engine import ChatEngine
        self.target, self.draft, self.device = target, draft, torch.device("cuda")
        self.engine = ChatEngine()
        self.engine.load_pair(target, draft)

    def ids(self, n: int) -> list[int]:
        tok = self.engine.target.tokenizer
        ids = tok(" ".join(PROMPTS), add_special_tokens=False)["input_ids"]
        return (ids * (n // len(ids) + 1))[:n]


def main(argv: list[str] | None = None) -> int:
    from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=DEFAULT_TARGET)
    parser.add_argument("--draft", default=DEFAULT_DRAFT)
    args = parser.parse_args(argv)
    import torch
    import transformers
    from engine.models.loading import quiet_library_logs
    cuda = torch.cuda.is_available()
    print(f"versions: python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"transformers {transformers.__version__}", flush=True)
    if not cuda:
        print("device: no CUDA GPU on this machine: every GPU check below is skipped (run this on a CUDA machine)")
        for name in CHECKS:
            print(f"{name}: skipped (no CUDA GPU)")
        return 0
    print(f"device: {torch.cuda.get_device_name()} (compute capability {torch.cuda.get_device_capability()}, "
          f"bf16={torch.cuda.is_bf16_supported()})", flush=True)
    quiet_library_logs()
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    ctx, failed = Context(args.target, args.draft), 0
    funcs = (check_auto, check_runner, check_rows, check_greedy, check_sampling, check_judge, check_calibration,
             check_speed, check_memory, check_launch)
    for name, func in zip(CHECKS, funcs):
        try:
            print(f"{name}: ok: {func(ctx)}", flush=True)
        except Exception as err:  # one line per check, whatever happens; the next check still runs
            failed += 1
            print(f"{name}: FAIL: {type(err).__name__}: {str(err)[:300]}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
