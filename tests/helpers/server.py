"""Start a real ``launch.py`` for a test module: a free port, a fresh --cache-dir, the converted weights reused."""
from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers.constants import SMOL

ROOT = Path(__file__).resolve().parents[2]
SMOL_PAIR = ["--target", SMOL, "--draft", SMOL, "--draft-precision", "nf4"]
STARTUP_S = 600  # a loaded CI machine can take minutes to load and measure


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def link_models(cache_dir: Path) -> None:
    """Reuse converted weights and GGUF files: <cache-dir>/models and /gguf -> the normal cache root's."""
    from engine.models.catalog import cache_root

    for folder in ("models", "gguf"):  # converted weights, and assembled GGUF files (precision gguf runs them)
        shared = cache_root() / folder
        shared.mkdir(parents=True, exist_ok=True)
        (cache_dir / folder).symlink_to(shared, target_is_directory=True)


def wait_for_server(url: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"launch.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(1)
    pytest.fail(f"launch.py did not serve {url} within {STARTUP_S} s:\n{log.read_text()[-3000:]}")


def wait_for_figures(url: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the pair's figures are in (measured beside serving): the tests that follow see the adaptive k draft on
    measured prices, as a user does after the first minute (tests/bench/test_launch_time.py checks the minute)."""
    import json

    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"launch.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with urllib.request.urlopen(url + "v1/models", timeout=10) as r:
            if not (json.loads(r.read())["data"][0].get("x_identity") or {}).get("measuring"):
                return
        time.sleep(1)
    pytest.fail(f"launch.py's figures were not in within {STARTUP_S} s:\n{log.read_text()[-3000:]}")


RUNNING: dict[str, tuple[subprocess.Popen, Path]] = {}  # url -> a launched app's process and log


def server_report(url: str, lines: int = 80) -> str:
    """What a launched app was doing, for a failed test's report: every thread's stack (launch.py dumps them on
    SIGUSR1) and the log's last ``lines``, its status lines first."""
    proc, log = RUNNING[url]
    if proc.poll() is None and hasattr(signal, "SIGUSR1"):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    text = log.read_text(errors="replace").splitlines()
    status = [line[:300] for line in text if line.startswith("[speclens]")]
    return "\n".join(["launch.py's status lines:", *status, f"... its last {lines} lines:",
                      *(line[:300] for line in text[-lines:])])


@contextmanager
def launched(cache_dir: Path, *args: str, figures: bool = True):
    """``launch.py --no-browser`` with ``args`` on a free port; yields its URL (ending in "/") once it serves and,
    with ``figures``, once the pair's figures are in."""
    link_models(cache_dir)
    port, log = free_port(), cache_dir / "launch.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "launch.py", "--no-browser", "--port", str(port), *args,
                                 "--cache-dir", str(cache_dir)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    RUNNING[url] = (proc, log)
    try:
        wait_for_server(url, proc, log)
        if figures:
            wait_for_figures(url, proc, log)
        yield url
    finally:
        RUNNING.pop(url, None)
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def serving(app):
    """An ASGI ``app`` served by uvicorn on a free port, in a thread of this process; yields its URL (ending in
    "/"). For the server's own behaviour (auth, disconnects) on fake engines, without launch.py's model load."""
    import threading

    import uvicorn

    port = free_port()
    # a page's event stream left open would hold a graceful shutdown until uvicorn's own limit: 1 s is enough here
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            pytest.fail("the test server did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        server.should_exit = True
        thread.join(timeout=20)
