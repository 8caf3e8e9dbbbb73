"""Precision ``gguf``: a GGUF file's own quantisation, run by llama.cpp through llama-cpp-python's low-level API.

The model is loaded once (mmap: the file's pages, shared); each runner gets a llama.cpp context (its own KV
cache) from a pool. A runner let go of returns its context with the tokens it still holds, and the next runner
of the same model resumes from them (``ModelRunner.resume``): a chat's next turn prefills only what is new, as
llama-server's ``cache_prompt`` does, and a chat in another tab costs a re-prefill.

Settings (``GgufSettings``): flash attention on and weight repacking off by default. Measured on a 2-core Zen 3
(issue 25's probe): with flash attention off no verify row equals the same token fed alone; with repacking on
rows differ from 4 rows up (the repacked GEMM takes over); with it off they are equal up to 5 rows at the same
single-token speed. Whether that holds on this machine is measured at load like every runner's
(engine/decode/identity.py).
"""
from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
import weakref
from dataclasses import dataclass
from pathlib import Path

from engine.errors import MissingDependencyError, ModelFormatError

GGUF = "gguf"
LOG_ENV = "SPECLENS_LLAMA_LOG"  # "1": llama.cpp's own log on stderr (silent otherwise)
INSTALL_HINT = ('pip install -e ".[gguf]" (builds llama.cpp from source: about 15 minutes on 2 cores; '
                "see README)")
_LOG_CALLBACK = None  # kept alive: llama.cpp calls it for every log line


@dataclass(frozen=True)
class GgufSettings:
    flash_attn: bool = True
    repack: bool = False  # llama.cpp's "extra buffer types": repacked weights for its wider GEMMs
    n_ctx: int = 8192  # tokens per context (each runner's KV cache), at most the model's training context
    threads: int | None = None  # None: torch's thread count (the physical cores)


def llama_cpp_available() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def require_llama_cpp():
    """The ``llama_cpp`` module, or a MissingDependencyError that says how to install it."""
    try:
        import llama_cpp
    except ImportError as err:
        raise MissingDependencyError(f"precision gguf needs llama-cpp-python ({err}): {INSTALL_HINT}") from None
    return llama_cpp


def _quiet(lib) -> None:
    global _LOG_CALLBACK
    if os.environ.get(LOG_ENV) == "1" or _LOG_CALLBACK is not None:
        return
    _LOG_CALLBACK = lib.llama_log_callback(lambda level, text, data: None)
    lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))


class GgufModel:
    """A GGUF file loaded by llama.cpp, and the pool of its contexts."""

    def __init__(self, path: Path, settings: GgufSettings = GgufSettings()):
        import torch

        lib = self.lib = require_llama_cpp()
        _quiet(lib)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = settings.repack
        self.path, self.settings = Path(path), settings
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelFormatError(f"llama.cpp could not load {path} (set {LOG_ENV}=1 to see why)")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.n_ctx = min(settings.n_ctx, lib.llama_model_n_ctx_train(self.model))
        self.threads = settings.threads or torch.get_num_threads()
        self._idle: list[tuple] = []  # (ctx, batch, tokens) of contexts no runner holds
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, _free_model, lib, self.model, self._idle)
        self._closer.atexit = False  # at exit the process frees everything; llama.cpp may be gone first

    def describe(self) -> str:
        flash = "on" if self.settings.flash_attn else "off"
        return (f"llama.cpp {self.threads} threads, flash attention {flash}, repack "
                f"{'on' if self.settings.repack else 'off'}, {self.n_ctx}-token contexts")

    def runner(self, vocab_size: int):
        """A runner over an idle context (holding what its last runner left: ``resume`` keeps what still fits),
        or a new one. The context returns to the pool when the runner is let go of."""
        from engine.backends.llama_cpp_runner import LlamaCppRunner

        with self._lock:
            idle = self._idle.pop() if self._idle else None
        ctx, batch, tokens = idle or (*self._new_context(), [])
        runner = LlamaCppRunner(self.lib, ctx, batch, self.n_ctx, self.n_vocab, vocab_size, tokens)
        runner.owner = self  # the model outlives its runners' contexts
        weakref.finalize(runner, self._release, ctx, batch, runner.tokens)
        return runner

    def _release(self, ctx, batch, tokens: list[int]) -> None:
        with self._lock:
            self._idle.append((ctx, batch, tokens))

    def _new_context(self):
        lib, params = self.lib, self.lib.llama_context_default_params()
        params.n_ctx = params.n_batch = self.n_ctx  # one llama_decode per forward: its logits stay readable
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.settings.flash_attn
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.no_perf = True
        ctx = lib.llama_init_from_model(self.model, params)
        if not ctx:
            raise MemoryError(f"llama.cpp could not make a {self.n_ctx}-token context for {self.path.name}")
        return ctx, lib.llama_batch_init(self.n_ctx, 0, 1)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """llama.cpp's own tokenizer (tests compare it with the HF tokenizer's ids); ``special``: markers in
        ``text`` become control tokens, as a rendered chat template needs."""
        lib, data = self.lib, text.encode("utf-8")
        vocab = lib.llama_model_get_vocab(self.model)
        out = (lib.llama_token * (len(data) + 8))()
        n = lib.llama_tokenize(vocab, data, len(data), out, len(out), False, special)
        return list(out[:n])


def _free_model(lib, model, idle: list[tuple]) -> None:
    for ctx, batch, _ in idle:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    idle.clear()
    lib.llama_model_free(model)
