"""Which weights ``fastest`` runs a GGUF target on, measured on this machine: llama.cpp's repacked weights (its
"extra buffer types", what llama-server runs by default) or the weights as stored, both with fastest's f16 KV cache.

Neither is faster everywhere. On 2 Zen 5 cores (AVX-512) the repacked weights made a one-token forward of the 1.5B
target 1.37x faster and a 256-token prefill 1.43x slower; on 2 Zen 3 cores (AVX2) both were slower repacked (70 against
62 ms, 7.2 against 6.4 s; docs/bench.md). So the choice is measured, once per file and process, in a child process
(``python -m engine.models.repack_probe PATH`` prints the figures as JSON), since where repacked weights fail they kill
the process (a 2-core AMX VM: SIGILL at the first forward). Each setting is timed in alternation, round by round, so a
busy machine slows both alike, and priced on an answer: ``ANSWER_WIDE`` forwards of ``WIDE`` tokens (a 256-token
prompt's prefill costs about four 64-token forwards on both kinds) and ``ANSWER_ONE`` one-token forwards.

A probe on a busy machine (other processes took more than ``BUSY_SHARE`` of the CPUs while the child timed) or one
that outlasts its timeout chooses nothing: fastest keeps the weights as stored for that load, and the next load
measures again. Only a quiet probe's choice, or a fault, is kept for the process.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from engine.backends.llama_cpp import FAST_AS_STORED, FAST_SETTINGS, GgufModel, GgufSettings, died_of
from engine.models.cpu_watch import CpuWatch, others_reason
from engine.models.load_checks import forward_costs

CONTEXT = 64  # tokens cached before each timed forward
WIDE = 64  # the wide forward: a verify of known text, a quarter of a 256-token prefill
ANSWER_WIDE, ANSWER_ONE = 4, 128  # an answer as priced here: a 256-token prompt, 128 tokens decoded one by one
ROUNDS = 2  # alternating rounds; each setting's figure at a width is its fastest round (noise only adds time)
MARGIN = 0.03  # repacked only where it prices an answer at least this much cheaper: level keeps the weights as stored
SETTINGS = {"repacked": FAST_SETTINGS, "as stored": FAST_AS_STORED}


def probe(path: str | Path) -> dict:
    """Milliseconds of a one-token and a ``WIDE``-token forward after ``CONTEXT`` tokens for each of ``SETTINGS``:
    the fastest of ``ROUNDS`` alternating rounds, and ``others_share``: the share of all CPUs other processes took
    while they were timed (None where the system does not say). This runs in the child process."""
    watch = CpuWatch().start()
    runners = {}
    for name, settings in SETTINGS.items():
        model = GgufModel(path, replace(settings, n_ctx=CONTEXT + WIDE + 8, max_idle=1))
        runners[name] = (model, model.runner(model.n_vocab))
    best: dict[str, dict[int, float]] = {name: {} for name in SETTINGS}
    for _ in range(ROUNDS):
        for name, (_, runner) in runners.items():
            timed = {**forward_costs(runner, CONTEXT, [1], repeats=3), **forward_costs(runner, CONTEXT, [WIDE], 1)}
            for n, seconds in timed.items():
                best[name][n] = min(best[name].get(n, seconds), seconds)
    return {**{name: {"one_ms": 1000 * t[1], "wide_ms": 1000 * t[WIDE]} for name, t in best.items()},
            "others_share": watch.others_share()}


def answer_s(figures: dict[str, float]) -> float:
    """Seconds of the answer this module prices (``ANSWER_WIDE`` wide forwards, ``ANSWER_ONE`` one-token ones)."""
    return (ANSWER_WIDE * figures["wide_ms"] + ANSWER_ONE * figures["one_ms"]) / 1000


def choose(figures: dict[str, dict[str, float]]) -> tuple[GgufSettings, str]:
    """Fastest's settings from the probe's figures, and why, in the figures' own words."""
    stored, repacked = answer_s(figures["as stored"]), answer_s(figures["repacked"])
    pick = "repacked" if repacked <= (1 - MARGIN) * stored else "as stored"

    def said(name: str) -> str:
        f = figures[name]
        return f"{name} {f['one_ms']:.0f} ms a token, {f['wide_ms']:.0f} ms for {WIDE}"
    why = (f"measured here: {said('repacked')}; {said('as stored')}; an answer ({ANSWER_WIDE * WIDE}-token prompt, "
           f"{ANSWER_ONE} tokens) {repacked:.1f} s repacked, {stored:.1f} s as stored")
    return SETTINGS[pick], why


_KEPT: dict[Path, tuple[GgufSettings, str, str | None]] = {}  # settled choices by resolved path: quiet or a fault


def _not_kept(why: str) -> tuple[GgufSettings, str, None]:
    """The weights as stored for this load, and why nothing was kept: the next load measures again."""
    return FAST_AS_STORED, f"weights as stored: {why}; the next load measures again", None


def fastest_weights(path: str | Path, timeout_s: float = 600.0) -> tuple[GgufSettings, str, str | None]:
    """Fastest's llama.cpp settings for the GGUF file at ``path`` on this machine, why (the measured figures), and
    the fault where repacked weights cannot run here (then the weights as stored, and the why is the fault). A busy
    or timed-out probe keeps the weights as stored, says why, and is not kept: the next call measures again. One
    file is one choice however its path is written."""
    path = Path(path).resolve()
    if path in _KEPT:
        return _KEPT[path]
    name = path.name
    try:
        done = subprocess.run([sys.executable, "-m", __name__, str(path)], capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return _not_kept(f"timing {name} repacked and as stored took over {timeout_s:.0f} s here, so nothing was "
                         f"measured")
    if done.returncode == 0:
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        if busy := others_reason(figures.get("others_share"), f"{name} was timed repacked and as stored"):
            return _not_kept(f"{busy}, so the figures price the machine's load")
        _KEPT[path] = (*choose(figures), None)
        return _KEPT[path]
    if how := died_of(done.returncode):
        fault = f"llama.cpp died of {how} at a forward of {name} with repacked weights on this machine"
    else:
        fault = f"llama.cpp could not run {name} with repacked weights: {done.stderr.strip()[-300:]}"
    _KEPT[path] = (FAST_AS_STORED, fault, fault)
    return _KEPT[path]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m engine.models.repack_probe",
                                     description="time a GGUF file's forwards with repacked and stored weights (JSON)")
    parser.add_argument("path", help="the GGUF file")
    print(json.dumps(probe(parser.parse_args(argv).path)))


if __name__ == "__main__":
    main()
