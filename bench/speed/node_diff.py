"""Where a llama.cpp verify row stops being the token fed alone: the first node of the graph whose output differs.

    python -m bench.speed.node_diff [--model NAME] [--width 8] [--position 24] [--cache-v bf16] [--repack]

Feeds the same prompt's token at ``--position`` twice: alone, and as the first row of a verify forward of
``--width`` tokens. llama.cpp's eval callback (``cb_eval``) hands over every node of each graph as it is computed;
the node's slice for that token (index 0 along the dimension that holds the batch's tokens) is kept, and the
nodes are compared in order. Prints the first node whose bytes differ (its name, e.g. ``ffn_out-3``, and ggml op),
how many nodes matched before it, and its largest difference: the evidence of which op makes a verify row depend
on the verify's width (bench.speed.identity counts the rows; this names the op).
"""
from __future__ import annotations

import argparse
import ctypes
import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cli import arguments_checked
from engine.backends.llama_cpp import KV_TYPES, GgufModel, GgufSettings, repack_fault
from engine.backends.llama_cpp_runner import LlamaCppRunner
from engine.models.catalog import DEFAULT_TARGET
from engine.models.load_checks import IDENTITY_PROMPT
from engine.models.loading import load_tokenizer, quiet_library_logs
from engine.models.sources import check_source
from engine.models.prompt import template_ids
from engine.models.sources import gguf_file


class GgmlTensor(ctypes.Structure):
    """The head of ggml.h's ``struct ggml_tensor`` (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64), as far as the name."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


@functools.cache
def op_name(op: int) -> str:
    """ggml's name of an op (``ggml_op_name`` in the ggml library llama-cpp-python ships beside llama.cpp)."""
    import llama_cpp

    ggml = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    ggml.ggml_op_name.restype, ggml.ggml_op_name.argtypes = ctypes.c_char_p, [ctypes.c_int]
    return ggml.ggml_op_name(op).decode()


@dataclass(frozen=True)
class NodeDiff:
    nodes_compared: int  # nodes with a slice for the token in both graphs
    matched: int  # nodes equal before the first that differs (all of them when ``first`` is None)
    first: str | None  # "name (OP) #occurrence" of the first node that differs, e.g. "Qcur-0 (MUL_MAT) #1"; None: every compared node is equal
    max_abs: float  # its largest difference, read as float32 where the node is float32


def token_slice(t: GgmlTensor, n_tokens: int) -> bytes | None:
    """The bytes of the batch's first token in ``t``: index 0 along the one dimension of ``n_tokens`` (every
    dimension when the batch is one token); None when no single dimension holds the tokens."""
    ne, nb = list(t.ne), list(t.nb)
    dims = [d for d in range(1, 4) if ne[d] == n_tokens]
    if not t.data or (n_tokens > 1 and len(dims) != 1):
        return None
    if n_tokens > 1:
        ne[dims[0]] = 1
    element = nb[0]
    if element not in (1, 2, 4) or ne[0] * element != nb[1] and ne[1] > 1:
        return None  # quantised blocks or padded rows: not read element by element
    total = sum((n - 1) * s for n, s in zip(ne, nb)) + element
    raw = np.ctypeslib.as_array(ctypes.cast(t.data, ctypes.POINTER(ctypes.c_uint8)), shape=(total,))
    view = np.lib.stride_tricks.as_strided(raw, shape=(*reversed(ne), element), strides=(*reversed(nb), 1))
    return view.tobytes()


class Recorder:
    """The eval callback of one context: every node's token slice while ``n_tokens`` is set."""

    def __init__(self, lib):
        self.n_tokens, self.nodes = 0, []
        self.callback = lib.ggml_backend_sched_eval_callback(self._seen)

    def _seen(self, tensor, ask, _user) -> bool:
        if ask or not self.n_tokens:
            return True
        t = ctypes.cast(tensor, ctypes.POINTER(GgmlTensor)).contents
        data = token_slice(t, self.n_tokens)
        if data is not None:
            self.nodes.append((f"{t.name.decode(errors='replace')} ({op_name(t.op)})", t.type, data))
        return True


def recorded(gguf: GgufModel, vocab_size: int, ids: list[int], position: int, width: int) -> list[tuple]:
    recorder = Recorder(gguf.lib)
    params = gguf.context_params()
    params.cb_eval, params.cb_eval_user_data = recorder.callback, None
    runner = LlamaCppRunner(gguf, *gguf._new_context(params), vocab_size)
    runner.forward(ids[:position], n_logits=1)
    recorder.n_tokens = width
    runner.forward(ids[position:position + width], n_logits=width)
    gguf.lib.llama_batch_free(runner.batch)
    gguf.lib.llama_free(runner.ctx)
    return recorder.nodes


def _keyed(nodes: list[tuple]) -> list[tuple]:
    """Nodes named by name and occurrence (a graph may reuse a name), in the order of the first graph's names."""
    seen: dict[str, int] = {}
    out = []
    for name, kind, data in nodes:
        seen[name] = seen.get(name, 0) + 1
        out.append((f"{name} #{seen[name]}", kind, data))
    return out


def first_unequal_node(gguf: GgufModel, vocab_size: int, ids: list[int], position: int, width: int) -> NodeDiff:
    """Compare the token at ``position`` fed alone with the same token as row 0 of a ``width``-token verify."""
    alone = recorded(gguf, vocab_size, ids, position, 1)
    batched = recorded(gguf, vocab_size, ids, position, width)
    many_by_name = {name: (name, kind, data) for name, kind, data in _keyed(batched)}
    pairs = [(a, many_by_name[a[0]]) for a in _keyed(alone) if a[0] in many_by_name]
    for matched, ((name, kind, one), (_, _, many)) in enumerate(pairs):
        if one != many:
            diff = 0.0
            if kind == 0 and len(one) == len(many):  # GGML_TYPE_F32
                diff = float(np.abs(np.frombuffer(one, np.float32) - np.frombuffer(many, np.float32)).max())
            return NodeDiff(len(pairs), matched, name, diff)
    return NodeDiff(len(pairs), len(pairs), None, 0.0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.speed.node_diff", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=DEFAULT_TARGET)
    parser.add_argument("--width", type=int, default=8, help="the verify forward's tokens (>= 1)")
    parser.add_argument("--position", type=int, default=24, help="prompt tokens in the cache before it (>= 1)")
    parser.add_argument("--cache-k", default="f16", choices=sorted(KV_TYPES))
    parser.add_argument("--cache-v", default="bf16", choices=sorted(KV_TYPES))
    parser.add_argument("--repack", action="store_true", help="llama.cpp's repacked weights")
    parser.add_argument("--no-flash", action="store_true", help="flash attention off")
    args = parser.parse_args(argv)
    with arguments_checked(parser):
        check_source(args.model)
        if args.width < 1 or args.position < 1:
            raise ValueError(f"--width and --position take whole numbers >= 1, not {args.width} and {args.position}")
    quiet_library_logs()
    tokenizer = load_tokenizer(args.model)
    ids = template_ids(tokenizer, [{"role": "user", "content": IDENTITY_PROMPT}])
    while len(ids) < args.position + args.width:
        ids += ids
    settings = GgufSettings(flash_attn=not args.no_flash, repack=args.repack, cache_k=args.cache_k,
                            cache_v=args.cache_v, n_ctx=max(256, args.position + args.width))
    fault = repack_fault(gguf_file(args.model)) if args.repack else None
    if fault:  # it would take this process with it
        raise SystemExit(f"--repack: {fault}")
    gguf = GgufModel(gguf_file(args.model), settings)
    found = first_unequal_node(gguf, min(len(tokenizer), gguf.n_vocab), ids, args.position, args.width)
    print(f"{gguf.describe()}; width {args.width} at position {args.position}: {found.nodes_compared} nodes compared")
    if found.first is None:
        print("every node of the token's row is equal in both graphs")
    else:
        print(f"first node that differs: {found.first} after {found.matched} equal nodes "
              f"(max |difference| {found.max_abs:.3g})")


if __name__ == "__main__":
    main()
