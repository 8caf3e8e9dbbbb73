"""Two real ``launch.py`` instances (SmolLM2-135M) sharing one semantic cache in a real redis-server.

A prompt answered by one instance is an ``exact`` hit in the other; killing Redis mid-session fails no chat
and shows a warning; once Redis is back, both instances use it again.
"""
from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.constants import SMOL
from tests.helpers.redis_server import RedisServer, free_port, wait_until

pytestmark = pytest.mark.real
ROOT = Path(__file__).resolve().parents[2]
# The precisions are what auto gives: gguf (llama.cpp) on a CPU where llama-cpp-python is installed, as CI
# installs it; the path users take.
PAIR = ["--target", SMOL, "--draft", SMOL]
STARTUP_S = 900
RECOVERY_S = 120
Client = pytest.importorskip("gradio_client").Client


def _serving(url: str, proc: subprocess.Popen, log: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"launch.py exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """(redis server, [url of instance 1, url of instance 2], the processes' logs).

    Both instances use one --cache-dir (converted weights linked in, the target-only speed measured once by
    the first); their semantic cache is in Redis, so nothing of it is in that directory.
    """
    from engine.models.catalog import cache_root

    redis_server = RedisServer("redis8").start()
    models = cache_root() / "models"
    models.mkdir(parents=True, exist_ok=True)
    cache_dir = tmp_path_factory.mktemp("speclens-shared")
    (cache_dir / "models").symlink_to(models, target_is_directory=True)
    procs, urls, logs = [], [], []
    try:
        for name in ("one", "two"):
            port, log = free_port(), cache_dir / f"launch-{name}.log"
            with open(log, "w") as out:
                procs.append(subprocess.Popen(
                    [sys.executable, "launch.py", "--no-browser", "--port", str(port), *PAIR, "--cache-dir",
                     str(cache_dir), "--cache-url", redis_server.url, "--cache-namespace", "app-test"],
                    cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, "SPECLENS_CACHE_SECRET": "one secret for both instances"}))
            urls.append(f"http://127.0.0.1:{port}/")
            logs.append(log)
            proc = procs[-1]
            wait_until(lambda: _serving(urls[-1], proc, log), STARTUP_S, f"launch.py at {urls[-1]}", interval_s=1)
        yield redis_server, urls, logs
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=30)
        redis_server.stop()


def _chat(url: str, prompt: str, max_new_tokens: int = 128) -> dict:
    result = Client(url, verbose=False).predict(prompt, max_new_tokens=max_new_tokens, api_name="/chat")
    assert result["finish_reason"] in ("eos", "length") and result["text"]
    return result


def _cache_summary(url: str) -> str:
    return Client(url, verbose=False).predict(api_name="/cache_entries")[0]


def test_the_instances_run_what_auto_gives(shared):
    """Where llama-cpp-python is installed (CI), auto puts a CPU user on llama.cpp: so do these instances."""
    _, _, logs = shared
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        pytest.skip("llama-cpp-python is not installed: auto gives torch here")
    loaded = [line for line in logs[0].read_text().splitlines() if line.startswith("[speclens] loaded")]
    assert loaded and "(gguf)" in loaded[0], loaded


def test_an_answer_from_one_instance_is_an_exact_hit_in_the_other(shared):
    _, (one, two), _ = shared
    first = _chat(one, "Reply with just the word yes.")
    assert first["finish_reason"] == "eos", "the answer must finish to be stored"
    assert first["cache"]["outcome"] == "miss"
    # the same text: in verify mode (the app's default) instance two's target checks the signed record
    # against it in one forward and, accepting every token, serves it as an exact hit
    second = _chat(two, "Reply with just the word yes.")
    assert second["cache"]["outcome"] == "exact" and second["text"] == first["text"]
    assert "redis://127.0.0.1" in _cache_summary(two)


def test_redis_killed_then_restarted_fails_no_chat(shared):
    redis_server, (one, two), logs = shared
    redis_server.stop()
    during = _chat(one, "Reply with just the word no.")  # answered without the cache
    assert during["cache"]["outcome"] == "miss" and "unavailable" in during["cache"]["reason"]
    assert "cache-warning" in _cache_summary(one) and "unreachable" in _cache_summary(one)
    redis_server.start()  # same port; empty, as nothing was saved
    # answers cut by the token limit are not stored: instance one writes nothing while it waits, so only its
    # reads can show it that Redis is back (a write lost to the outage must not stay its warning)
    wait_until(lambda: _chat(one, "Write a long story about a lighthouse.", max_new_tokens=2)["cache"]["reason"] == ""
               and "cache-warning" not in _cache_summary(one), RECOVERY_S, "instance one to use Redis again")
    # a finished answer is stored again and shared: the restarted Redis lost the first test's one
    assert _chat(one, "Reply with just the word yes.")["finish_reason"] == "eos"
    assert _chat(two, "Reply with just the word yes.")["cache"]["outcome"] == "exact"
    assert all("Traceback" not in log.read_text() for log in logs)
