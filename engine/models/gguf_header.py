"""A GGUF file's header (its key-value metadata and its tensors' names) read in a fraction of a second.

transformers rebuilds a GGUF model's tokenizer and config from ``gguf.GGUFReader``'s ``fields`` and ``tensors``.
That reader makes a numpy view for every string of the vocabulary and the merges (300,000 of them for Qwen2.5) and
transformers then decodes each through a list of ints: 20 seconds for one file on a 2-core machine, at each first
launch. ``HeaderReader`` has the same ``fields`` and ``tensors`` as transformers reads them (``parts``, ``data``,
``types``; a tensor's ``name``), parsed with ``struct`` from the header alone, and ``header_reader()`` lends it to
transformers while it reads metadata (never tensors: it has no tensor data, and ``return_tensors`` would fail).

The format: magic, version, tensor count, key-value count; each key a string, a value type and a value (a string is
a u64 length and UTF-8 bytes; an array an element type, a u64 count and the elements); then each tensor's name,
dimensions, type and offset (github.com/ggml-org/ggml, docs/gguf.md).
"""
from __future__ import annotations

import functools
import mmap
import struct
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

STRING, ARRAY = 8, 9
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}  # type: format


@dataclass
class Field:
    """One key's value as gguf.GGUFReader lays it out: ``parts[i]`` for i in ``data`` are the values (a scalar as
    a one-item list, a string as bytes), ``types`` the value type, and the element type after ARRAY."""
    types: list[int]
    parts: list = field(default_factory=list)
    data: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Tensor:
    name: str


class HeaderReader:
    """``fields`` and ``tensors`` of the GGUF file at ``path``, as transformers reads them from gguf.GGUFReader."""

    def __init__(self, path, mode: str = "r"):
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            self._buf, self._at = buf, 0
            if self._take("<I")[0] != 0x46554747:  # b"GGUF", little-endian
                raise ValueError(f"{Path(path).name} is not a GGUF file")
            version, n_tensors, n_kv = self._take("<IQQ")
            if version < 2:
                raise ValueError(f"{Path(path).name}: GGUF version {version} is not supported")
            self.fields: dict[str, Field] = {  # the header's own, as gguf.GGUFReader lists them first
                "GGUF.version": Field([4], [[version]], [0]), "GGUF.tensor_count": Field([10], [[n_tensors]], [0]),
                "GGUF.kv_count": Field([10], [[n_kv]], [0])}
            for _ in range(n_kv):
                key = self._string().decode("utf-8")
                self.fields[key] = self._value(self._take("<I")[0])
            self.tensors = [self._tensor() for _ in range(n_tensors)]
            del self._buf

    def _take(self, fmt: str) -> tuple:
        values = struct.unpack_from(fmt, self._buf, self._at)
        self._at += struct.calcsize(fmt)
        return values

    def _string(self) -> bytes:
        (n,) = self._take("<Q")
        text = self._buf[self._at:self._at + n]
        self._at += n
        return text

    def _one(self, kind: int):
        if kind == STRING:
            return self._string()
        if kind not in SCALARS:
            raise ValueError(f"GGUF value type {kind} is not known")
        return list(self._take("<" + SCALARS[kind]))

    def _value(self, kind: int) -> Field:
        if kind != ARRAY:
            return Field([kind], [self._one(kind)], [0])
        inner, count = self._take("<IQ")
        if inner == ARRAY:
            raise ValueError("nested GGUF arrays are not read here")
        return Field([ARRAY, inner], [self._one(inner) for _ in range(count)], list(range(count)))

    def _tensor(self) -> Tensor:
        name = self._string().decode("utf-8")
        (dims,) = self._take("<I")
        self._at += 8 * dims + 4 + 8  # the dimensions, the type and the offset: not needed for metadata
        return Tensor(name)


_LENT = threading.Lock()  # one lender at a time: the swap is process-wide


@contextmanager
def header_reader():
    """Within this block, ``gguf.GGUFReader`` is ``HeaderReader``: transformers' ``from_pretrained(gguf_file=...)``
    of a tokenizer or a config reads the header alone. Never around a weight load (there is no tensor data)."""
    import gguf

    with _LENT:
        original, gguf.GGUFReader = gguf.GGUFReader, _read  # the tokenizer and the config read the file once
        try:
            yield
        finally:
            gguf.GGUFReader = original
            _read.cache_clear()


@functools.lru_cache(maxsize=2)
def _read(path, mode: str = "r") -> HeaderReader:
    return HeaderReader(path, mode)
