"""Bad model names and files fail at once with the engine's own errors, and leave nothing half-made."""
from pathlib import Path

import pytest

from engine.errors import EngineError, ModelFormatError, UnknownModelError
from engine.models.catalog import CACHE_DIR_ENV
from engine.models.sources import ALLOW_DOWNLOADS_ENV, hub_source, resolve_source

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_root(tmp_path, monkeypatch):
    root = tmp_path / "speclens-cache"
    monkeypatch.setenv(CACHE_DIR_ENV, str(root))
    return root


@pytest.mark.parametrize("content", [b"", b"hello, I am a text file\n", b"GGU"])
def test_a_gguf_name_that_is_not_gguf_is_refused_before_converting(tmp_path, cache_root, capsys, content):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(content)
    with pytest.raises(ModelFormatError, match="not a GGUF model file"):
        resolve_source(str(fake))
    assert "Converting" not in capsys.readouterr().out
    assert not (cache_root / "models").exists() or not any((cache_root / "models").iterdir())
    assert issubclass(ModelFormatError, EngineError)  # the app shows it as a readable message


def test_an_uncached_hub_id_fails_at_once_offline(monkeypatch):
    monkeypatch.delenv(ALLOW_DOWNLOADS_ENV, raising=False)
    with pytest.raises(UnknownModelError, match=f"not available offline.*{ALLOW_DOWNLOADS_ENV}=1"):
        resolve_source("speclens-tests/no-such-model-anywhere")


def test_a_name_with_one_slash_that_is_no_repo_id_is_an_unknown_model(monkeypatch):
    monkeypatch.delenv(ALLOW_DOWNLOADS_ENV, raising=False)
    with pytest.raises(UnknownModelError, match="unknown model"):
        resolve_source("<img src=x onerror=alert(1)><b>bold</b>")


def test_downloads_can_be_allowed(monkeypatch):
    monkeypatch.setenv(ALLOW_DOWNLOADS_ENV, "1")
    assert hub_source("speclens-tests/no-such-model-anywhere") == "speclens-tests/no-such-model-anywhere"


def test_a_cached_hub_id_resolves_to_its_local_snapshot(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub_constants

    snapshot = tmp_path / "models--org--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "models--org--tiny" / "refs" / "main").write_text("abc123")
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv(ALLOW_DOWNLOADS_ENV, raising=False)
    assert resolve_source("org/tiny") == str(snapshot)


def test_library_warnings_are_quieted_only_when_asked():
    """Importing the loader changes no warning filter and no logger level; quiet_library_logs() does."""
    import subprocess
    import sys

    subprocess.run([sys.executable, "-m", "tests.helpers.quiet_logs"], check=True, cwd=ROOT, timeout=300)


def test_converted_weights_go_to_the_cache_dir_given_not_the_environments(tmp_path, monkeypatch):
    import engine.models.catalog as catalog

    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "from-env"))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    made = []
    monkeypatch.setattr(catalog, "convert_gguf", lambda source, out_dir: made.append(out_dir))
    source = resolve_source(str(gguf), cache_dir=tmp_path / "given")
    assert made == [Path(source)] and Path(source).parent == tmp_path / "given" / "models"
    assert not (tmp_path / "from-env").exists()


def test_a_damaged_gguf_is_a_format_error_and_leaves_nothing_behind(tmp_path):
    from engine.models.catalog import convert_gguf

    gguf = tmp_path / "damaged.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 16)  # the magic, then a version no reader handles
    with pytest.raises(ModelFormatError, match="could not convert"):
        convert_gguf(gguf, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["damaged.gguf"]


@pytest.mark.parametrize("error", [MemoryError(), TypeError("a bug")])
def test_a_conversion_that_fails_for_another_reason_is_no_format_error(tmp_path, monkeypatch, error):
    import transformers

    from engine.models.catalog import convert_gguf

    def fail(*args, **kwargs):
        raise error
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fail)
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(type(error)):
        convert_gguf(gguf, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]


def test_a_failed_save_leaves_nothing_half_made(tmp_path, monkeypatch):
    import transformers

    from engine.models.catalog import convert_gguf

    class Saves:
        def save_pretrained(self, path):
            Path(path).mkdir(parents=True)
            (Path(path) / "half.safetensors").write_bytes(b"half")
            raise OSError(28, "No space left on device")
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: Saves())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: Saves())
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(20))
    with pytest.raises(OSError, match="No space left"):
        convert_gguf(gguf, tmp_path / "out")
    assert [p.name for p in tmp_path.iterdir()] == ["model.gguf"]
