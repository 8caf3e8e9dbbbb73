"""A GGUF file's tokenizer and config, read from the file's own metadata: what precision gguf needs beside
llama.cpp, with no weights converted.

llama.cpp runs the file's weights; the app still tokenises with the Hugging Face tokenizer (the chat template, the
text-is-text encoding, the pair check: the same ids as llama.cpp's, tested) and reads the model's sizes from its
config. transformers rebuilds both from the GGUF's metadata (its vocabulary, merges and chat template) without
reading a tensor, from the header as engine/models/gguf_header.py reads it. Rebuilding a large vocabulary still takes
seconds, so the result is kept as a small directory (the
tokenizer files and config.json, a few MB) under the cache directory, keyed by the file's path, size and mtime as
the torch path's converted weights are (engine/models/catalog.py); a read-only cache directory keeps it in memory
only. Within a process each file is read once.
"""
from __future__ import annotations

import functools
import hashlib
import shutil
from pathlib import Path

from engine.errors import ModelFormatError
from engine.models.catalog import GGUF_FORMAT_ERRORS, cache_dir_of, made_once
from engine.models.gguf_header import header_reader

META_DIR = "gguf-meta"  # under the cache directory: one folder per GGUF file


def metadata_dir(path: Path, cache_dir: Path | None = None) -> Path:
    """Where ``path``'s tokenizer and config are kept: keyed by the file's resolved path, size and mtime."""
    stat = path.stat()
    key = hashlib.sha256(f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    return cache_dir_of(cache_dir) / META_DIR / f"{path.stem}-{key}"


def gguf_tokenizer(path: Path, cache_dir: Path | None = None):
    """The Hugging Face tokenizer of the GGUF file ``path`` (its chat template included)."""
    return _metadata(str(metadata_dir(path, cache_dir)), str(path))[0]


def gguf_config(path: Path, cache_dir: Path | None = None):
    """The transformers config of the GGUF file ``path``: the model's sizes (layers, heads, vocabulary)."""
    return _metadata(str(metadata_dir(path, cache_dir)), str(path))[1]


@functools.lru_cache(maxsize=8)
def _metadata(kept: str, gguf: str) -> tuple[object, object]:
    """(tokenizer, config) of ``gguf``: from the kept directory, else rebuilt from the file and kept there."""
    from transformers import AutoConfig, AutoTokenizer

    out, path = Path(kept), Path(gguf)
    if (out / "config.json").exists():  # renamed into place whole: read without a lock
        return AutoTokenizer.from_pretrained(out), AutoConfig.from_pretrained(out)
    try:
        with header_reader():  # the metadata alone, in seconds (engine/models/gguf_header.py)
            tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
            config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    except GGUF_FORMAT_ERRORS as err:  # a damaged or unsupported GGUF
        first_line = (str(err).splitlines() or [type(err).__name__])[0]
        raise ModelFormatError(f"could not read the tokenizer and config of {path}: {first_line}") from err
    _keep(out, tokenizer, config)
    return tokenizer, config


def _keep(out: Path, tokenizer, config) -> None:
    """Save both into ``out`` (whole, or not at all); a cache directory that cannot be written keeps nothing."""
    tmp = out.with_name(out.name + ".partial")
    try:
        with made_once(out):
            if (out / "config.json").exists():
                return
            shutil.rmtree(tmp, ignore_errors=True)
            tokenizer.save_pretrained(tmp)
            config.save_pretrained(tmp)
            tmp.replace(out)
    except OSError:  # a read-only or full cache directory: read from the file again next time
        shutil.rmtree(tmp, ignore_errors=True)
