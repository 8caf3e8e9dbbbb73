"""Forward cost per precision: seconds for one forward of n new tokens after a fixed context, per model.

python -m bench.speed.forward [--models NAME,NAME] [--precisions bf16,int8-dynamic] [--tokens 1,2,4,8,16]
                               [--context 100] [--repeats 3] [--verify-modes identical,fastest] [--json OUT]

The default precisions follow the device the models load on (DEFAULT_PRECISIONS): the CPU's candidates on a CPU,
bf16 and nf4 on a CUDA GPU (fp16 for bf16 where the GPU has none), bf16 on Apple's MPS.

Prints one row per (model, precision) with the median milliseconds at each n and the fitted t(n) = a + b*n,
and the detected machine. Rerun it with ``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2`` to see an
AVX2-only CPU. Models are loaded one at a time. ``--verify-modes`` measures a GGUF model under the llama.cpp settings
each verify mode runs it with (engine/serve/verify_mode.py ``target_settings``: ``fastest`` runs the weights repacked
or as stored, whichever engine/models/repack_probe.py times cheaper here) and fastest's two candidates
(``fastest-as-stored``; ``fastest-repacked``, where repacked weights run here): with ``--context 0`` and a wide n
(256) a row's widest forward is a prompt's prefill.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics

from tqdm.auto import tqdm

from engine.backends.llama_cpp import FAST_AS_STORED, FAST_SETTINGS, GgufSettings, repack_fault
from engine.config import VERIFY_MODES
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
from engine.models.load_checks import forward_costs
from engine.costs.costmodel import fit_line
from engine.models.devices import half_precision
from engine.models.hardware import detect_machine
from engine.models.loading import default_device, load_model, quiet_library_logs, runner_for, with_gguf_settings
from engine.serve.verify_mode import target_settings


# fastest's two candidates, whichever it runs here (target_settings, engine/models/repack_probe.py): FAST_AS_STORED,
# and FAST_SETTINGS (repacked weights, where they run here: repack_fault)
AS_STORED, REPACKED = "fastest-as-stored", "fastest-repacked"
SETTINGS_NAMES = (*VERIFY_MODES, AS_STORED, REPACKED)
DEFAULT_PRECISIONS = {"cpu": ("int8-dynamic", "int8-weight", "bf16"), "cuda": ("bf16", "nf4"), "mps": ("bf16",)}


def default_precisions(device) -> list[str]:
    """What is worth measuring on ``device`` (only precisions it can run: int8-dynamic is CPU-only)."""
    names = DEFAULT_PRECISIONS[device.type]
    return [half_precision(device) if p == "bf16" and device.type != "cpu" else p for p in names]


def measure(models: list[str], precisions: list[str], tokens: list[int], context: int, repeats: int,
            role: str = "target", attentions: tuple[str, ...] = (), modes: tuple[str, ...] = ()) -> list[dict]:
    """Per model, all precisions loaded together and measured in alternation (round by round), so a busy
    machine slows them alike and the ratios hold. ``attentions`` (e.g. eager, sdpa) measures each loaded model
    under each attention implementation too, rows named ``precision/attention``; ``modes`` (identical, fastest) a
    GGUF model under each verify mode's llama.cpp settings, rows named ``gguf/mode``."""
    rows = []
    for name in models:
        runners = {}
        for precision in precisions:  # as listed: put int8-dynamic first (it passes through fp32 while loading)
            loaded = load_model(name, precision, role=role)  # int4 drafts re-quantise Q5_0/Q8_0 too
            settings = {mode: mode_settings(loaded.backend, mode) for mode in modes}
            for mode, chosen in settings.items():
                if chosen is not None:  # llama.cpp runs it: the settings this mode runs it with
                    variant = with_gguf_settings(loaded, chosen)
                    runners[f"{loaded.precision}/{mode}"] = (runner_for(variant), variant.model, None)
            for attention in () if any(settings.values()) else attentions or (None,):
                label = loaded.precision if attention is None else f"{loaded.precision}/{attention}"
                runners[label] = (runner_for(loaded), loaded.model, attention)
            gc.collect()
        samples = {p: {n: [] for n in tokens} for p in runners}
        for _ in tqdm(range(repeats), desc=name, leave=False):
            for label, (runner, model, attention) in runners.items():
                if attention is not None:  # a torch model's attention implementation
                    model.set_attn_implementation(attention)
                for n, seconds in forward_costs(runner, context, tokens, 1).items():
                    samples[label][n].append(seconds)
        for precision, by_n in samples.items():
            costs = {n: statistics.median(times) for n, times in by_n.items()}
            fixed, per_token = fit_line(list(costs), list(costs.values()))
            rows.append({"model": name, "precision": precision, "ms": {n: s * 1e3 for n, s in costs.items()},
                         "fit_a_ms": fixed * 1e3, "fit_b_ms": per_token * 1e3})
        del runners
        gc.collect()
    return rows


def mode_settings(backend, mode: str) -> GgufSettings | None:
    """The llama.cpp settings ``mode`` (SETTINGS_NAMES) runs ``backend``'s model with; None: not llama.cpp's."""
    if getattr(backend, "settings", None) is None or mode not in (AS_STORED, REPACKED):
        return target_settings(backend, mode)[0]
    if mode == AS_STORED:
        return FAST_AS_STORED
    return FAST_SETTINGS if repack_fault(backend.path) is None else None


def format_rows(rows: list[dict], tokens: list[int]) -> str:
    head = f"{'model':<30} {'precision':<24}" + "".join(f"{f'n={n}':>9}" for n in tokens) + "   fit a+b*n (ms)"
    lines = [head]
    for r in rows:
        cells = "".join(f"{r['ms'][n]:>9.0f}" for n in tokens)
        lines.append(f"{r['model']:<30} {r['precision']:<24}{cells}   {r['fit_a_ms']:.0f} + {r['fit_b_ms']:.0f}*n")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.forward", description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=f"{DEFAULT_TARGET},{DEFAULT_DRAFT}")
    parser.add_argument("--precisions", default=None, help="comma-separated (default: per device, see above)")
    parser.add_argument("--tokens", default="1,2,4,8,16", help="numbers of new tokens fed per forward")
    parser.add_argument("--context", type=int, default=100, help="tokens already in the KV cache")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention", default="", help="e.g. eager,sdpa: each model under each attention "
                        "implementation (default: what load_model picks, eager on the CPU)")
    parser.add_argument("--role", choices=("target", "draft"), default="target",
                        help="load the models as this role (int4: a draft re-quantises the GGUF's 5/6/8-bit tensors)")
    parser.add_argument("--verify-modes", default="", help="e.g. identical,fastest: a GGUF model under the llama.cpp "
                        "settings each verify mode runs it with (fastest: repacked or stored weights, whichever is "
                        f"timed cheaper here) and fastest's two candidates ({AS_STORED}, {REPACKED})")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    tokens = [int(n) for n in args.tokens.split(",")]
    modes = tuple(m.strip() for m in args.verify_modes.split(",") if m.strip())
    if set(modes) - set(SETTINGS_NAMES):
        unknown = ", ".join(sorted(set(modes) - set(SETTINGS_NAMES)))
        parser.error(f"--verify-modes takes {', '.join(SETTINGS_NAMES)}, not {unknown}")
    quiet_library_logs()
    machine, device = detect_machine(), default_device()
    precisions = [p.strip() for p in args.precisions.split(",")] if args.precisions else default_precisions(device)
    print(f"machine: {machine.describe()}, models on {device}: {', '.join(precisions)}", flush=True)
    rows = measure([m.strip() for m in args.models.split(",")], precisions, tokens, args.context, args.repeats,
                   args.role, tuple(a.strip() for a in args.attention.split(",") if a.strip()), modes)
    print(format_rows(rows, tokens))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine.describe(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
