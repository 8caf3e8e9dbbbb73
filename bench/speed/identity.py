"""Which runner settings keep a verify row the same as the token fed alone, on this machine, and at what speed.

    python -m bench.speed.identity [--model NAME] [--precision gguf] [--widths 2-17]
                                   [--positions 24,256,1024,4096] [--cost-contexts 24] [--json OUT]

The load-time check (engine/decode/identity.py) on one model, per setting: for ``gguf``, each of
``GGUF_SETTINGS`` (flash attention, weight repacking, the KV cache's K and V types; each a fresh load of the
file); for a torch precision, the one way it loads. Prints per setting the rows equal out of rows compared at
each width and position, the largest drift (rounding steps of the top logit), the median milliseconds of a
one-token forward and t(n), a forward of n tokens in one-token forwards, so a bit-identical setting can be
weighed against a faster one. The costs are timed after ``--cost-contexts`` cached tokens, the first in the
main table and each further one in a table of its own: attention's share grows with the context, and the KV
cache's types change which of ggml's flash-attention paths it takes (docs/bench.md, "The KV cache's types and
repacked weights at depth").
"""
from __future__ import annotations

import argparse
import json

from tqdm.auto import tqdm

from bench.cli import arguments_checked
from engine.config import check_precision
from engine.decode.identity import LONG_POSITION, SHORT_POSITION, measure_identity
from engine.models.load_checks import IDENTITY_PROMPT, forward_costs
from engine.models.catalog import DEFAULT_TARGET
from engine.models.sources import gguf_file
from engine.models.loading import load_model, load_tokenizer, quiet_library_logs, runner_for
from engine.models.sources import check_source
from engine.models.prompt import template_ids

GGUF_SETTINGS = [  # (flash attention, repack, K type, V type): the app's default first, llama-server's second
    (True, False, "f16", "bf16"), (True, True, "f16", "f16"), (True, False, "f16", "f16"),
    (True, True, "f16", "bf16"), (True, False, "q8_0", "q8_0"), (False, False, "f16", "f16")]
COST_WIDTHS = (2, 4, 8)  # t(n) columns


def parse_widths(text: str) -> tuple[int, ...]:
    """``2-16`` or ``2,3,5``: verify widths of at least 2."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    widths = []
    for part in parts:
        low, _, high = part.partition("-")
        widths += list(range(int(low), int(high or low) + 1))
    if not widths or min(widths) < 2:
        raise ValueError(f"--widths takes verify widths of at least 2 (e.g. 2-16), not {text!r}")
    return tuple(sorted(set(widths)))


def parse_positions(text: str, flag: str = "--positions") -> tuple[int, ...]:
    try:
        positions = tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        positions = ()
    if not positions or min(positions) < 1:
        raise ValueError(f"{flag} takes whole numbers >= 1 (e.g. 24,256), not {text!r}")
    return positions


def setting_label(setting: tuple[bool, bool, str, str]) -> str:
    flash, repack, cache_k, cache_v = setting
    return f"flash {'on' if flash else 'off'}, repack {'on' if repack else 'off'}, K {cache_k} V {cache_v}"


def measure_settings(model: str, precision: str, widths: tuple[int, ...], positions: tuple[int, ...],
                     cost_contexts: tuple[int, ...] = (SHORT_POSITION,)) -> list[dict]:
    ids = template_ids(load_tokenizer(model), [{"role": "user", "content": IDENTITY_PROMPT}])
    rows = []
    settings = GGUF_SETTINGS if precision == "gguf" else [None]
    loaded = load_model(model, precision)  # the one way a torch precision loads; gguf: the vocabulary to cut to
    for setting in tqdm(settings, desc="settings", leave=False):
        if setting is None:
            runner, label = runner_for(loaded), precision
        else:
            from engine.backends.llama_cpp import GgufModel, GgufSettings, repack_fault
            flash, repack, cache_k, cache_v = setting
            fault = repack_fault(gguf_file(model)) if repack else None
            if fault:  # it would take this process with it
                rows.append({"setting": setting_label(setting), "skipped": fault})
                continue
            gguf = GgufModel(gguf_file(model), GgufSettings(flash_attn=flash, repack=repack, cache_k=cache_k,
                                                            cache_v=cache_v))
            runner, label = gguf.runner(loaded.vocab_size), setting_label(setting)
        check = measure_identity(runner, ids, precision, widths, positions)
        by_context = {}
        for context in cost_contexts:
            costs = {n: s * 1e3 for n, s in forward_costs(runner, context, [1, *COST_WIDTHS], repeats=5).items()}
            by_context[context] = {"single_token_ms": costs[1], "t_n": {n: costs[n] / costs[1] for n in COST_WIDTHS}}
        runner.reset()
        first = by_context[cost_contexts[0]]
        rows.append({"setting": label, "rows_equal": check.rows_equal, "rows": check.rows,
                     "max_drift_steps": check.max_drift_steps, "identical": check.identical,
                     "first_unequal": check.first_unequal, "single_token_ms": first["single_token_ms"],
                     "t_n": first["t_n"], "costs_by_context": by_context,
                     "unequal_widths": [f"{pos}/{width}" for pos, width in check.unequal],
                     "equal_by_position": check.equal_by_position})
        del runner
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.identity", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_TARGET)
    parser.add_argument("--precision", default="gguf", help="gguf (each of llama.cpp's settings) or a torch precision")
    parser.add_argument("--widths", default="2-17", help="verify widths, e.g. 2-17 or 2,3,5")
    parser.add_argument("--positions", default=f"{SHORT_POSITION},{LONG_POSITION},1024,4096",
                        help="tokens of the prompt in the cache before each verify")
    parser.add_argument("--cost-contexts", default=str(SHORT_POSITION),
                        help="tokens in the cache before each timed forward, e.g. 24,3072")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        check_precision(args.precision)
        check_source(args.model)
        widths = parse_widths(args.widths)
        positions = parse_positions(args.positions)
        cost_contexts = parse_positions(args.cost_contexts, "--cost-contexts")
        from engine.backends.llama_cpp import GgufSettings
        n_ctx = GgufSettings().n_ctx
        room = n_ctx - max(COST_WIDTHS)  # the app's context size, less the widest timed forward
        if max(cost_contexts) > room:
            raise ValueError(f"--cost-contexts takes contexts up to {room} tokens (the app's {n_ctx}-token "
                             f"contexts, less {max(COST_WIDTHS)}), not {args.cost_contexts!r}")
    quiet_library_logs()
    rows = measure_settings(args.model, args.precision, widths, positions, cost_contexts)
    print(f"costs after {cost_contexts[0]} cached tokens")
    print(f"{'setting':<38} {'rows equal':>12} {'by position':<24} {'max drift':>9} {'1-token ms':>10} "
          + " ".join(f"{f't({n})':>5}" for n in COST_WIDTHS) + "  unequal (position/width)")
    for r in rows:
        if "skipped" in r:
            print(f"{r['setting']:<38} skipped: {r['skipped']}")
            continue
        unequal = ", ".join(r["unequal_widths"]) or "none"
        by_position = " ".join(f"{p}:{e}/{n}" for p, (e, n) in r["equal_by_position"].items())
        print(f"{r['setting']:<38} {r['rows_equal']:>5}/{r['rows']:<6} {by_position:<24} {r['max_drift_steps']:>9.1f} "
              f"{r['single_token_ms']:>10.1f} " + " ".join(f"{r['t_n'][n]:>5.2f}" for n in COST_WIDTHS)
              + f"  {unequal}")
    for context in cost_contexts[1:]:
        print(f"\ncosts after {context} cached tokens")
        print(f"{'setting':<38} {'1-token ms':>10} " + " ".join(f"{f't({n})':>5}" for n in COST_WIDTHS))
        for r in rows:
            if "skipped" not in r:
                cost = r["costs_by_context"][context]
                print(f"{r['setting']:<38} {cost['single_token_ms']:>10.1f} "
                      + " ".join(f"{cost['t_n'][n]:>5.2f}" for n in COST_WIDTHS))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "widths": widths, "positions": positions, "cost_contexts": cost_contexts,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
