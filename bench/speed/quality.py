"""What a precision costs in quality: teacher-forced top-1 agreement with bf16 and the perplexity ratio.

python -m bench.speed.quality [--model NAME] [--precisions bf16,int4,int8-weight] [--ctx 512] [--chunks 8]
                        [--text FILE] [--llama-perplexity] [--json OUT]

The text is the source of Python's own ``textwrap`` module (4,400 tokens: the same on every machine with this
Python) unless ``--text`` names a file. It is scored the way llama.cpp's ``llama-perplexity`` scores it: chunks of
``--ctx`` tokens, each a fresh forward, the second half of each chunk scored. The first precision is the
reference (bf16: the GGUF dequantised). ``--llama-perplexity`` also runs llama.cpp on the same GGUF and text.
"""
from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import tempfile
import textwrap
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from engine.models.catalog import DEFAULT_TARGET, model_gguf
from engine.models.loading import load_model, load_tokenizer, quiet_library_logs


@dataclass(frozen=True)
class Quality:
    precision: str
    perplexity: float
    top1_agreement: float  # share of scored positions whose argmax equals the reference precision's
    scored: int


def default_text() -> str:
    return inspect.getsource(textwrap)


def chunks(ids: list[int], ctx: int, limit: int | None) -> list[list[int]]:
    whole = [ids[i:i + ctx] for i in range(0, len(ids) - ctx + 1, ctx)]
    return whole[:limit] if limit else whole


@torch.inference_mode()
def scored_logits(model, pieces: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the scored positions, (positions, vocab), and the tokens they predict."""
    logps, targets = [], []
    for piece in tqdm(pieces, desc="chunks", leave=False):
        ctx = len(piece)
        logits = model(input_ids=torch.tensor([piece])).logits[0].float()  # (ctx, vocab)
        first = ctx // 2  # llama-perplexity scores positions first .. ctx - 2, predicting the next token
        logps.append(torch.log_softmax(logits[first:ctx - 1], dim=-1))
        targets.append(torch.tensor(piece[first + 1:]))
    return torch.cat(logps), torch.cat(targets)


def measure(name: str, precisions: list[str], text: str, ctx: int, limit: int | None) -> list[Quality]:
    rows, reference_top1 = [], None
    for precision in precisions:
        loaded = load_model(name, precision)
        ids = loaded.tokenizer(text, add_special_tokens=False)["input_ids"]
        logp, targets = scored_logits(loaded.model, chunks(ids, ctx, limit))
        logp = logp[:, :loaded.vocab_size]
        nll = -logp.gather(1, targets[:, None]).mean()
        top1 = logp.argmax(dim=-1)
        reference_top1 = top1 if reference_top1 is None else reference_top1
        rows.append(Quality(precision, math.exp(float(nll)), float((top1 == reference_top1).float().mean()),
                            len(targets)))
        del loaded
    return rows


def format_rows(rows: list[Quality], peer: float | None) -> str:
    base = rows[0]
    lines = [f"{'precision':<13} {'perplexity':>10} {'vs ' + base.precision:>9} {'top-1 = ' + base.precision:>14}"]
    lines += [f"{r.precision:<13} {r.perplexity:>10.4f} {r.perplexity / base.perplexity:>9.4f} "
              f"{r.top1_agreement:>14.4f}" for r in rows]
    if peer is not None:
        lines.append(f"{'llama.cpp':<13} {peer:>10.4f} {peer / base.perplexity:>9.4f} {'':>14}")
    lines.append(f"({base.scored} scored tokens)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.quality", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_TARGET)
    parser.add_argument("--precisions", default="bf16,int4,int8-weight")
    parser.add_argument("--ctx", type=int, default=512, help="tokens per chunk (llama-perplexity's -c)")
    parser.add_argument("--chunks", type=int, default=8, help="chunks scored at most")
    parser.add_argument("--text", help="a UTF-8 text file (default: the source of Python's textwrap module)")
    parser.add_argument("--llama-perplexity", action="store_true", help="also run llama.cpp's llama-perplexity")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    if args.ctx < 4 or args.chunks < 1:
        parser.error("--ctx must be at least 4 and --chunks at least 1")
    try:
        text = open(args.text, encoding="utf-8").read() if args.text else default_text()
    except (OSError, UnicodeDecodeError) as err:
        parser.error(f"cannot read --text {args.text}: {err}")
    quiet_library_logs()
    rows = measure(args.model, [p.strip() for p in args.precisions.split(",")], text, args.ctx, args.chunks)
    peer = None
    if args.llama_perplexity:  # llama.cpp scores every whole chunk of the text: give it the chunks scored here
        from bench.peer.perplexity import llama_perplexity
        with tempfile.TemporaryDirectory() as tmp:
            text_file = Path(tmp) / "text.txt"
            ids = load_tokenizer(args.model)(text, add_special_tokens=False)["input_ids"]
            text_file.write_text(load_tokenizer(args.model).decode(ids[:args.ctx * args.chunks]), encoding="utf-8")
            peer = llama_perplexity(model_gguf(args.model), text_file, context=args.ctx,
                                    threads=torch.get_num_threads()).ppl
    print(format_rows(rows, peer))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model, "rows": [asdict(r) for r in rows], "llama_perplexity": peer}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
