"""What a model name refers to, found without loading anything: a built-in, a .gguf file, a local HF directory or
a hub id; where ``from_pretrained`` reads it (converting GGUF files once); and which names precision gguf runs."""
from __future__ import annotations

import os
from pathlib import Path

from engine.errors import InvalidSettingError, ModelFormatError, UnknownModelError
from engine.models.catalog import BUILTIN_MODELS, builtin_dir, model_gguf, user_gguf_dir
from engine.backends.llama_cpp import llama_cpp_available

GGUF_MAGIC = b"GGUF"
ALLOW_DOWNLOADS_ENV = "SPECLENS_ALLOW_DOWNLOADS"  # "1": hub ids not in the local cache are downloaded


def source_kind(name: str) -> tuple[str, str | Path]:
    """How a model name is read, without converting or loading anything: ("builtin", name), ("gguf", path) for
    a GGUF file (its magic bytes checked), ("dir", path) for a local HF directory or ("hub", id). Raises
    UnknownModelError for anything else and ModelFormatError for a ``.gguf`` that is not GGUF."""
    name = name.strip()
    if name in BUILTIN_MODELS:
        return "builtin", name
    path = Path(os.path.expanduser(name))
    if path.is_file() and path.suffix == ".gguf":
        check_gguf_file(path)  # before any conversion starts
        return "gguf", path
    if path.is_dir() and (path / "config.json").exists():
        return "dir", path
    if name.count("/") == 1 and not path.exists() and all(name.split("/")):
        return "hub", name
    raise _unknown(name)


def check_source(name: str) -> None:
    """Everything :func:`resolve_source` would refuse, found in milliseconds (the command-line tools check their
    model names with it before loading anything): a hub id must also be in the local cache."""
    kind, where = source_kind(name)
    if kind == "hub":
        hub_source(str(where))


def resolve_source(name: str, cache_dir: Path | None = None) -> str:
    """A directory or hub id that ``from_pretrained`` understands, converting GGUF files on first use into
    ``cache_dir`` (default: :func:`engine.models.catalog.cache_root`)."""
    kind, where = source_kind(name)
    if kind == "builtin":
        return str(builtin_dir(str(where), cache_dir))
    if kind == "gguf":
        return str(user_gguf_dir(Path(where), cache_dir))
    return str(where) if kind == "dir" else hub_source(str(where))


def _unknown(name: str) -> UnknownModelError:
    return UnknownModelError(f"unknown model {name!r}: not a built-in name, a .gguf file, a local HF directory "
                             f"or a hub id (org/name). Built-in models: {', '.join(BUILTIN_MODELS)}")


def check_gguf_file(path: Path) -> None:
    """A GGUF file starts with the magic bytes ``GGUF``; anything else is refused before it is converted."""
    with open(path, "rb") as f:
        head = f.read(len(GGUF_MAGIC))
    if head != GGUF_MAGIC:
        what = "empty" if not head else f"starts with {head!r}"
        raise ModelFormatError(f"{path} is not a GGUF model file ({what}, expected {GGUF_MAGIC!r})")


def hub_source(repo_id: str) -> str:
    """A hub id resolves to its snapshot in the local Hugging Face cache; without one it fails at once
    (no network retries) unless downloads are allowed with SPECLENS_ALLOW_DOWNLOADS=1."""
    if os.environ.get(ALLOW_DOWNLOADS_ENV) == "1":
        return repo_id
    from huggingface_hub import try_to_load_from_cache

    try:
        config = try_to_load_from_cache(repo_id, "config.json")
    except ValueError:  # not a valid repo id (HFValidationError)
        raise _unknown(repo_id) from None
    if isinstance(config, str):
        return str(Path(config).parent)  # the cached snapshot directory: loads without network
    raise UnknownModelError(f"{repo_id!r} is not available offline: it is not in the local Hugging Face cache. "
                            f"Set {ALLOW_DOWNLOADS_ENV}=1 to download it, or use a local directory or .gguf file")


def gguf_model(name: str) -> bool:
    """Whether ``name`` is a GGUF model (a built-in or a .gguf file), which precision gguf can run."""
    try:
        return source_kind(name)[0] in ("builtin", "gguf")
    except (UnknownModelError, ModelFormatError):
        return False


def gguf_runnable(name: str) -> bool:
    """Whether precision gguf can run ``name`` here: a GGUF model, and llama-cpp-python installed."""
    return llama_cpp_available() and gguf_model(name)


def gguf_file(name: str, cache_dir: Path | None = None) -> Path:
    """The GGUF file llama.cpp runs for ``name``: a built-in's assembled file, or the user's own."""
    kind, where = source_kind(name)
    if kind == "builtin":
        return model_gguf(str(where), cache_dir)
    if kind == "gguf":
        return Path(where)
    raise InvalidSettingError(f"precision gguf needs a GGUF model (a built-in name or a .gguf file); {name!r} is "
                              f"a Hugging Face model: choose int8-weight, int4 or bf16")
