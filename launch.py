"""Start SpecLens: load a target/draft pair, measure the target-only speed once, and serve the Gradio app.

    python launch.py                      # default pair, http://127.0.0.1:7860, opens the browser
    python launch.py --target smollm2-135m-instruct --draft smollm2-135m-instruct --draft-precision nf4
"""
from __future__ import annotations

import argparse
import os
import sys
import time

from engine.config import PRECISIONS  # a plain module: no torch, so --help stays instant


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="SpecLens: a local chat app that makes speculative decoding visible.")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on (default: 7860)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab at startup")
    p.add_argument("--target", default=None,
                   help="target model: a built-in name, a Hugging Face id, a local directory or a .gguf file "
                        "(default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default=None, help="draft model, same forms as --target "
                                                 "(default: qwen2.5-coder-0.5b-instruct)")
    p.add_argument("--target-precision", choices=PRECISIONS, default="auto",
                   help="precision of the target (default: auto = measured fastest for this machine: nf4 on a GPU, "
                        "bf16 on AMX CPUs, int8-weight on other CPUs)")
    p.add_argument("--draft-precision", choices=PRECISIONS, default="auto",
                   help="precision of the draft (default: auto = nf4 on a GPU, int8-dynamic on CPU)")
    p.add_argument("--cache-dir", default=None,
                   help="directory for converted models, the semantic cache and the measured target-only "
                        "speeds (sets SPECLENS_CACHE_DIR; default: $SPECLENS_CACHE_DIR or ~/.cache/speclens)")
    return p.parse_args(argv)


def open_semantic_cache():
    """The semantic cache under the cache root, or None (with a message) when its embedder is unavailable."""
    from engine.catalog import cache_root
    from engine.cache.embedder import load_default_embedder
    from engine.cache.semantic_cache import SemanticCache

    print("[speclens] opening the semantic cache (MiniLM embedder)…", flush=True)
    try:
        return SemanticCache(cache_root() / "semantic-cache", load_default_embedder())
    except Exception as err:  # the app works without a cache
        print(f"[speclens] semantic cache disabled: {type(err).__name__}: {err}", flush=True)
        return None


def load_engine(args: argparse.Namespace):
    """Create the engine and load the pair, printing progress. Exits with a readable message on failure."""
    from engine.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    from engine.errors import EngineError
    from engine.session import ChatEngine

    target, draft = args.target or DEFAULT_TARGET, args.draft or DEFAULT_DRAFT
    start = time.perf_counter()
    engine = ChatEngine(cache=open_semantic_cache())
    print(f"[speclens] loading target {target} and draft {draft} (first use converts the weights once)…",
          flush=True)
    try:
        info = engine.load_pair(target, draft, args.target_precision, args.draft_precision)
    except EngineError as err:
        sys.exit(f"[speclens] could not load the pair: {err}")
    print(f"[speclens] loaded {info.target} ({info.target_precision}) + {info.draft} ({info.draft_precision}) "
          f"on {info.device} in {time.perf_counter() - start:.1f} s", flush=True)
    print(f"[speclens] precision: {info.precision_note}", flush=True)
    return engine


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.cache_dir:
        os.environ["SPECLENS_CACHE_DIR"] = os.path.abspath(os.path.expanduser(args.cache_dir))
    engine = load_engine(args)

    from app.context import AppContext
    from app.ui import build_demo, launch_kwargs

    ctx = AppContext(engine)
    print("[speclens] measuring the target-only speed (once per target and precision)…", flush=True)
    baseline = ctx.ensure_baseline()
    print(f"[speclens] target-only: {baseline['tokens_per_s']:.1f} tok/s ({baseline['how']})", flush=True)
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=1)
    print(f"[speclens] serving on http://{args.host}:{args.port}", flush=True)
    demo.launch(server_name=args.host, server_port=args.port, inbrowser=not args.no_browser,
                show_error=True, **launch_kwargs())


if __name__ == "__main__":
    main()
