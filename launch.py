"""Start SpecLens: load a target/draft pair and serve the Gradio app; the pair's figures are measured beside serving.

    python launch.py                      # default pair, http://127.0.0.1:7860, opens the browser
    python launch.py --target smollm2-135m-instruct --draft smollm2-135m-instruct --draft-precision nf4
    python launch.py --cache-url redis://:PASSWORD@cache-host:6379/0   # one semantic cache for many instances
"""
from __future__ import annotations

import argparse
import errno
import faulthandler
import ipaddress
import os
import signal
import socket
import sys
import threading
import time
import webbrowser
from pathlib import Path

from engine.config import AUTO, PRECISIONS
from engine.precision import overview

API_KEY_ENV = "SPECLENS_API_KEY"
CACHE_URL_ENV = "SPECLENS_CACHE_URL"
CACHE_SECRET_ENV = "SPECLENS_CACHE_SECRET"
# every secret, by its argument name, and the variable it may come from instead (``secret`` reads each one alike)
SECRETS = {"api_key": API_KEY_ENV, "cache_url": CACHE_URL_ENV, "cache_secret": CACHE_SECRET_ENV}
GRACEFUL_SHUTDOWN_S = 3  # on Ctrl-C, answers in flight get 3 s (uvicorn's default waits for a tab's endless heartbeat)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="launch.py",
                                description="SpecLens: a local chat app that makes speculative decoding visible.")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default: 127.0.0.1, this machine only)")
    p.add_argument("--port", type=int, default=7860, help="port to serve on (default: 7860)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser tab at startup")
    p.add_argument("--target", default=None,
                   help="target model: a built-in name, a Hugging Face id, a local directory or a .gguf file "
                        "(default: qwen2.5-coder-1.5b-instruct)")
    p.add_argument("--draft", default=None, help="draft model, same forms as --target "
                                                 "(default: qwen2.5-coder-0.5b-instruct)")
    from engine.models.auto import default_pair_note  # torch: what auto picks depends on the device

    p.add_argument("--target-precision", choices=PRECISIONS, default=AUTO,
                   help=f"precision of the target (default: auto): {overview()}. Here auto picks, for the default "
                        f"pair: {default_pair_note()}".replace("%", "%%"))
    p.add_argument("--draft-precision", choices=PRECISIONS, default=AUTO,
                   help="precision of the draft (default: auto, which picks both: see --target-precision)")
    add_secret_options(p, "--api-key", "the API key",
                       help="guard the server with a key: the /v1 routes need 'Authorization: Bearer KEY', the UI "
                            "and Gradio's API a login with the key as password (default: $SPECLENS_API_KEY; unset: "
                            "no key needed). Prefer the variable or --api-key-file: every user can read a command line")
    p.add_argument("--cache-dir", default=None, help="directory for converted models, the semantic cache and the "
                   "measured target-only speeds (default: $SPECLENS_CACHE_DIR, else ~/.cache/speclens)")
    add_secret_options(p, "--cache-url", "--cache-url",
                       help="put the semantic cache in Redis, shared by every instance that uses the same URL and "
                            "namespace: redis://[:password@]host:port/db (default: $SPECLENS_CACHE_URL, else a "
                            "local directory under the cache root). With a password, prefer the variable or "
                            "--cache-url-file")
    add_secret_options(p, "--cache-secret", "the cache secret",
                       help="a secret (16+ bytes) shared by every instance of the semantic cache: records are signed "
                            "(HMAC-SHA256) and those that do not check are refused. Without one, a shared (Redis) "
                            "cache serves nothing unchecked: the target verifies every hit (default: "
                            "$SPECLENS_CACHE_SECRET; on the command line, `ps` shows it: prefer the variable or "
                            "--cache-secret-file)")
    p.add_argument("--cache-namespace", default=os.environ.get("SPECLENS_CACHE_NAMESPACE") or "speclens",
                   help="key prefix in Redis; deployments with different namespaces never see each other's "
                        "entries (default: $SPECLENS_CACHE_NAMESPACE or speclens)")
    p.add_argument("--no-semantic-cache", action="store_true", help="run without the semantic cache (no MiniLM)")
    p.add_argument("--cache-max-entries", type=int, default=None,
                   help="Redis only: beyond this many entries the oldest are evicted (default 100000)")
    args = p.parse_args(argv)
    if not 0 <= args.port <= 65535:
        p.error(f"--port {args.port}: a port is a number in [0, 65535]")
    for name, env in SECRETS.items():
        setattr(args, name, secret(p, args, name, env))
    return args


def add_secret_options(parser: argparse.ArgumentParser, option: str, what: str, help: str) -> None:
    """``--NAME`` and ``--NAME-file`` (FILE's first line), the pair every secret has, read by ``secret``: the
    file keeps the value out of the command line, which ``ps`` shows to every user."""
    parser.add_argument(option, default=None, help=help)
    parser.add_argument(f"{option}-file", metavar="FILE", help=f"read {what} from FILE (its first line)")


def secret(parser: argparse.ArgumentParser, args: argparse.Namespace, name: str, env: str) -> str | None:
    """A secret from ``--NAME``, ``--NAME-file`` (first line) or the environment variable ``env``, in that order
    of precedence; the file and the variable keep it out of ``ps``. None when none is given."""
    flag, path = getattr(args, name), getattr(args, f"{name}_file")
    option = "--" + name.replace("_", "-")
    if flag and path:
        parser.error(f"give {option} or {option}-file, not both")
    if path:
        try:
            lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
        except OSError as err:
            parser.error(f"{option}-file {path}: {err.strerror or err}")
        except UnicodeDecodeError:
            parser.error(f"{option}-file {path}: not UTF-8 text")
        if not lines or not lines[0].strip():
            parser.error(f"{option}-file {path}: the first line is empty")
        return lines[0].strip()
    return flag or os.environ.get(env) or None


def _no_phoning_home() -> None:
    """A local app calls nobody: no Gradio analytics or version check, no Hugging Face telemetry. Set before any
    gradio or huggingface_hub import (app/ui.py also builds its Blocks with analytics_enabled=False)."""
    os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def open_semantic_cache(cache_dir: Path, cache_url: str | None = None, namespace: str = "speclens",
                        secret: str | None = None, max_entries: int | None = None):
    """The semantic cache in Redis (``cache_url``) or in ``cache_dir``; None (with a message) when it cannot
    be opened: the store is unavailable (a locked directory, or no directory at all) or the embedder is missing.
    A read-only directory is served read-only, with a note. A Redis that is down is not an error: the cache
    warns and reconnects later. A bad URL, namespace or secret ends the program with a message; any other
    error is a bug and propagates."""
    from engine.cache.stores import StoreUnavailable, is_url, open_store
    from engine.cache.embedder import load_default_embedder
    from engine.cache.records import mask_url
    from engine.cache.semantic_cache import SemanticCache
    from engine.errors import InvalidSettingError

    if cache_url and not is_url(cache_url):
        sys.exit(f"[speclens] --cache-url {mask_url(cache_url)}: expected redis://, rediss:// or unix://")
    print("[speclens] opening the semantic cache (MiniLM embedder)…", flush=True)
    try:
        store = open_store(cache_url or cache_dir / "semantic-cache", namespace=namespace, max_entries=max_entries)
        cache = SemanticCache(store, load_default_embedder(), secret=secret)
    except InvalidSettingError as err:
        sys.exit(f"[speclens] {err}")
    except (StoreUnavailable, OSError, ImportError) as err:  # ImportError, OSError: the embedder is missing
        message = str(err).replace(cache_url, mask_url(cache_url)) if cache_url else str(err)
        print(f"[speclens] semantic cache disabled: {type(err).__name__}: {message}", flush=True)
        return None
    signed = " (records signed with the cache secret)" if secret else \
        " (no --cache-secret: every hit is verified by the target)" if cache_url else ""
    searched = f", searched by {cache.search}" if cache.search else ""
    print(f"[speclens] semantic cache: {cache.location}{searched}{signed}", flush=True)
    if cache.problem:
        print(f"[speclens] warning: {cache.problem}", flush=True)
    return cache


def load_engine(args: argparse.Namespace, cache_dir: Path):
    """Create the engine and load the pair, printing progress. Exits with a readable message when the pair
    cannot be loaded (a bad model or setting, or a disk problem while converting)."""
    from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET
    from engine.models.loading import quiet_library_logs
    from engine.errors import EngineError
    from engine.chat_engine import ChatEngine

    quiet_library_logs()

    target, draft = args.target or DEFAULT_TARGET, args.draft or DEFAULT_DRAFT
    start = time.perf_counter()
    cache = None if args.no_semantic_cache else open_semantic_cache(
        cache_dir, args.cache_url, args.cache_namespace, args.cache_secret, args.cache_max_entries)
    engine = ChatEngine(cache=cache, cache_dir=cache_dir)
    print(f"[speclens] loading target {target} and draft {draft}…", flush=True)
    try:
        info = engine.load_pair(target, draft, args.target_precision, args.draft_precision)
    except EngineError as err:
        sys.exit(f"[speclens] could not load the pair: {err}")
    except OSError as err:  # e.g. no space left for the converted weights
        sys.exit(f"[speclens] could not load the pair: {type(err).__name__}: {err}")
    print(f"[speclens] loaded {info.target} ({info.target_precision}) + {info.draft} ({info.draft_precision}) "
          f"on {info.device} in {time.perf_counter() - start:.1f} s", flush=True)
    print(f"[speclens] precision: {info.precision_note}; {info.runner}", flush=True)
    print_checks(info)
    return engine


def print_checks(info) -> None:
    """The pair's load-time figures, or that they are being measured (then again once they are in)."""
    print(f"[speclens] identity: {info.identity_note}", flush=True)
    if info.verify_mode:  # identity up to some verify width: the mode chosen by the measured costs, and each's price
        print(f"[speclens] {info.verify_mode}: {info.verify_note} (the Pair panel switches it)", flush=True)
    if speed := info.target_speed:
        print(f"[speclens] target-only: {speed.decode_tokens_per_s:.1f} tok/s decoding ({speed.how}); "
              f"{info.checks_note}", flush=True)


def cache_dir_problem(path: str) -> str | None:
    """Why ``path`` cannot be the cache directory, or None. A read-only one is fine: models converted elsewhere
    load from it, the semantic cache in it is served read-only, and measurements stay in memory."""
    existing = path
    while not os.path.exists(existing):  # the nearest part of the path that exists (missing ones get created)
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        return f"{existing} is a file, not a directory; pass a directory (created if missing)"
    return None


def choose_cache_dir(flag: str | None) -> Path:
    """``--cache-dir``, else ``$SPECLENS_CACHE_DIR`` or ~/.cache/speclens (read here, once); it is passed on to
    the model loader, the semantic cache and the speed measurements. Exits when it cannot be a directory."""
    from engine.models.catalog import CACHE_DIR_ENV, cache_root

    path = os.path.abspath(os.path.expanduser(flag or str(cache_root())))
    if problem := cache_dir_problem(path):
        where = "--cache-dir" if flag else f"${CACHE_DIR_ENV}" if os.environ.get(CACHE_DIR_ENV) else \
            "the cache directory ($XDG_CACHE_HOME/speclens)" if os.environ.get("XDG_CACHE_HOME") else \
            "the cache directory (~/.cache/speclens)"
        sys.exit(f"[speclens] {where} {path}: {problem}")
    return Path(path)


def is_loopback(host: str) -> bool:
    """Whether ``host`` is this machine only (127.0.0.1, ::1, localhost): nobody else can reach a server there."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None)} if host else set()
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """What a server that other machines can reach gives away with no key; None on loopback or with a key."""
    if api_key or is_loopback(host):
        return None
    return (f"[speclens] warning: serving on {host} with no --api-key: anyone who can reach this machine on the "
            "network can use the models, load others, run experiments on them, and read and clear the semantic cache "
            "(the prompts and answers of everyone who chatted). Give a key: $SPECLENS_API_KEY or --api-key-file")


def bind_port(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the models load, so a port in use ends the program at once with a message.
    uvicorn serves on it and listens once the app is ready (a visitor is refused until then, not kept waiting): only a
    server that also sets SO_REUSEADDR and listens first could take the port meanwhile. SO_REUSEADDR, IPv6 for ":", a
    TCP socket by name (protocol 0 kept asyncio from setting TCP_NODELAY: 40 ms a reused connection's request)."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        problem = {errno.EADDRINUSE: "the port is in use (another speclens, or another server): stop it or give "
                                     "another --port",
                   errno.EADDRNOTAVAIL: "that is not an address of this machine: check --host",
                   errno.EACCES: "no permission to use this port (ports below 1024 need privileges): give another "
                                 "--port"}.get(err.errno, err.strerror or str(err))
        sys.exit(f"[speclens] cannot serve on {host}:{port}: {problem}")
    return sock


def main(argv: list[str] | None = None) -> None:
    _no_phoning_home()
    args = parse_args(argv)
    cache_dir = choose_cache_dir(args.cache_dir)
    if warning := exposure_warning(args.host, args.api_key):
        print(warning, flush=True)
    with bind_port(args.host, args.port) as sock:
        serve(args, cache_dir, load_engine(args, cache_dir), sock)


def serve(args: argparse.Namespace, cache_dir: Path, engine, sock: socket.socket) -> None:
    """Serve the UI and the API on ``sock`` until stopped; the pair's figures are measured meanwhile."""
    import uvicorn

    from app.baseline import BaselineStore
    from app.context import AppContext
    from app.api.openai_routes import create_server
    from app.ui import build_demo, launch_kwargs

    ctx = AppContext(engine, BaselineStore(cache_dir / "baselines.json"))
    if engine.info().measuring:  # said again once they are in; the server does not wait
        threading.Thread(target=lambda: print_checks(engine.wait_measured()), daemon=True).start()
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=1)
    port = sock.getsockname()[1]  # --port 0: the one the system chose
    app = create_server(ctx, demo, args.api_key, server_name=args.host, server_port=port, show_error=True,
                        **launch_kwargs())
    url = f"http://{f'[{args.host}]' if ':' in args.host else args.host}:{port}"
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S))
    key_note = " (API key required; the UI asks for it as the password)" if args.api_key else ""
    line = f"[speclens] serving on {url} — OpenAI-compatible API at {url}/v1{key_note}"
    threading.Thread(target=_when_started, args=(server, line, None if args.no_browser else url), daemon=True).start()
    server.run(sockets=[sock])


def _when_started(server, line: str, browse: str | None) -> None:
    """Once the server answers: the "serving on" line, and the browser tab at ``browse`` (None: no tab)."""
    while not server.started and not server.should_exit:
        time.sleep(0.2)
    if server.started:
        print(line, flush=True)
        if browse:
            webbrowser.open(browse)


if __name__ == "__main__":
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: every thread's stack on stderr
    main()
