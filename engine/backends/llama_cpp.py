"""llama.cpp's runtime, precision ``gguf``: a GGUF file's own quantisation, run through llama-cpp-python's low-level
API. ``GgufModel`` is the loaded file as a ``Backend`` (engine/backends/contract.py); its runners are
engine/backends/llama_cpp_runner.py's. torch is not imported here.

The model is loaded once (mmap: the file's pages, shared); each runner gets a llama.cpp context (its own KV
cache) from a pool. A runner let go of returns its context with the tokens it still holds, and the next runner
of the same model resumes from them (``Runner.resume``): a chat's next turn prefills only what is new, as
llama-server's ``cache_prompt`` does, and a chat in another tab costs a re-prefill.

Settings (``GgufSettings``): flash attention on, weight repacking off and the KV cache's K in f16 with V in bf16 by
default, the setting measured with the most verify rows equal to the same tokens fed alone (docs/models.md has the
measurements: K and V of different types keep flash attention off its split-KV and tiled paths, which treat one
row and several differently). Where they are equal on
this machine is measured at load like every runner's (engine/decode/identity.py).
"""
from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.backends.contract import common_prefix
from engine.errors import MissingDependencyError, ModelFormatError

GGUF = "gguf"
LOG_ENV = "SPECLENS_LLAMA_LOG"  # "1": llama.cpp's own log on stderr (silent otherwise)
INSTALL_HINT = "'pip install llama-cpp-python==0.3.36' (builds llama.cpp for this CPU: docs/models.md)"
_LOG_CALLBACK = None  # kept alive: llama.cpp calls it for every log line
log = logging.getLogger(__name__)


KV_TYPES = {"f32": 0, "f16": 1, "q8_0": 8, "bf16": 30}  # ggml_type's values for the KV cache's K and V tensors


@dataclass(frozen=True)
class GgufSettings:
    flash_attn: bool = True
    repack: bool = False  # llama.cpp's "extra buffer types": repacked weights for its wider GEMMs
    cache_k: str = "f16"  # the KV cache's element types (KV_TYPES): K and V of different types keep flash attention
    cache_v: str = "bf16"  # on the path that handles every row alike (docs/models.md)
    n_ctx: int = 8192  # tokens per context (each runner's KV cache), at most the model's training context
    threads: int | None = None  # None: the physical cores (physical_cores), as torch's default thread count
    # contexts kept idle for the next runner (each holds its last conversation, which its next turn resumes: a chat's
    # and a script's keep theirs); one let go beyond them is freed, oldest first, so after concurrent answers the
    # memory goes back to what two conversations need
    max_idle: int = 2


# the fastest verify mode's settings (llama-server's defaults): repacked weights and an f16 KV cache, whose flash
# attention takes ggml's split-KV and tiled paths (cheaper verifies at depth); identical to one-token forwards only up
# to rounding ties. Fastest runs them where engine/models/repack_probe.py times them cheaper than the weights as stored
# (a one-token forward 1.37x faster on Zen 5; slower on Zen 3, prefill too) and where they run (``repack_fault``)
FAST_SETTINGS = GgufSettings(repack=True, cache_k="f16", cache_v="f16")
# fastest's other settings: its KV cache, the weights as stored
FAST_AS_STORED = GgufSettings(cache_k=FAST_SETTINGS.cache_k, cache_v=FAST_SETTINGS.cache_v)


def physical_cores(cpus: Path = Path("/sys/devices/system/cpu")) -> int:
    """The machine's physical cores: torch's default thread count where OMP_NUM_THREADS is not set, so both runtimes
    run one thread per core (a core's second hardware thread shares its vector units). Linux reads each CPU's
    (package, core) pair; elsewhere, or without that topology, every logical CPU counts."""
    cores = set()
    for cpu in cpus.glob("cpu[0-9]*/topology"):
        try:
            cores.add(((cpu / "physical_package_id").read_text().strip(), (cpu / "core_id").read_text().strip()))
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1


def died_of(returncode: int | None) -> str | None:
    """The signal's name where ``returncode`` says a signal killed the process (SIGILL, SIGSEGV), else None."""
    if returncode is None or returncode >= 0:
        return None
    return signal.Signals(-returncode).name if -returncode in signal.valid_signals() else f"signal {-returncode}"


@functools.lru_cache(maxsize=None)
def repack_fault(path: Path, timeout_s: float = 300.0) -> str | None:
    """Why llama.cpp's repacked weights (``GgufSettings.repack``) cannot run ``path`` on this machine, or None where
    they can: the file loaded with them and a forward of 8 tokens and of 1, in a child process, since where they fail
    they kill the process (a 2-core AMX VM: llama.cpp's AMX GEMM died of SIGILL at its first forward, docs/bench.md)."""
    code = ("import sys; from engine.backends.llama_cpp import GgufModel, GgufSettings; "
            "m = GgufModel(sys.argv[1], GgufSettings(repack=True, n_ctx=64)); r = m.runner(m.n_vocab); "
            "r.forward(list(range(1, 9))); r.forward([9])")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode == 0:
        return None
    if how := died_of(done.returncode):
        return f"llama.cpp died of {how} at a forward of {Path(path).name} with repacked weights on this machine"
    return f"llama.cpp could not run {Path(path).name} with repacked weights: {done.stderr.strip()[-300:]}"


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


# a prompt goes on from an idle context's conversation where it shares at least this share of the context's tokens: a
# chat's next turn shares all but the end of the last answer, which the chat template writes its own way
GOES_ON = 0.9


class GgufModel:
    """A GGUF file loaded by llama.cpp, and the pool of its contexts: the ``Backend`` of precision gguf."""
    kind = "llama.cpp"

    def __init__(self, path: Path, settings: GgufSettings = GgufSettings()):
        lib = self.lib = require_llama_cpp()
        _quiet(lib)
        lib.llama_backend_init()
        params = lib.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_extra_bufts = settings.repack
        # repacked weights are copies made at load: a mapped file would stay resident beside them (the 1.5B: 1.1 GB
        # more than llama-server held), so the file is read, not mapped, where they are used
        if settings.repack:
            params.load_mode = lib.LLAMA_LOAD_MODE_NONE
        self.path, self.settings = Path(path), settings
        self.model = lib.llama_model_load_from_file(str(path).encode(), params)
        if not self.model:
            raise ModelFormatError(f"llama.cpp could not load {path} (set {LOG_ENV}=1 to see why)")
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))
        self.n_ctx = min(settings.n_ctx, lib.llama_model_n_ctx_train(self.model))
        self.threads = settings.threads or physical_cores()
        self._idle: list[tuple] = []  # (ctx, batch, tokens, row widths) of contexts no runner holds, oldest first
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, _free_model, lib, self.model, self._idle)
        self._closer.atexit = False  # at exit the process frees everything; llama.cpp may be gone first

    def describe(self) -> str:
        flash = "on" if self.settings.flash_attn else "off"
        return (f"{self.kind} {self.threads} threads, flash attention {flash}, repack "
                f"{'on' if self.settings.repack else 'off'}, KV cache K {self.settings.cache_k} V "
                f"{self.settings.cache_v}, {self.n_ctx}-token contexts")

    def weight_bytes(self) -> int:
        """The GGUF file's size: llama.cpp maps its weights as they are stored."""
        return self.path.stat().st_size

    def runner(self, vocab_size: int, context_ids: list[int] | None = None):
        """A runner over an idle context, holding what its last runner left (``resume`` keeps what is still valid),
        or over a new, empty one. The context returns to the pool when the runner is let go of. ``context_ids``: the
        prompt the runner is for, which picks the context (``_pick``); None: a runner that empties its context (a
        measurement, the judge), whose context is the first to be reused or freed once let go of."""
        from engine.backends.llama_cpp_runner import LlamaCppRunner  # numpy, and torch for the logits

        with self._lock:
            pick = self._pick(context_ids)
            idle = self._idle.pop(pick) if pick is not None else None
        if log.isEnabledFor(logging.DEBUG):  # which conversation a request resumes, or which one it cuts
            held = "a new context" if idle is None else \
                f"an idle context holding {len(idle[2])} tokens ({common_prefix(idle[2], context_ids or [])} shared)"
            log.debug("%s: a runner for %s takes %s", self.path.name,
                      f"{len(context_ids)} prompt tokens" if context_ids else "an emptied context", held)
        ctx, batch, tokens, widths = idle or (*self._new_context(), [], [])
        runner = LlamaCppRunner(self, ctx, batch, vocab_size, tokens, widths)
        weakref.finalize(runner, self._release, ctx, batch, runner.tokens, runner.row_widths, context_ids is None)
        return runner

    def _pick(self, context_ids: list[int] | None) -> int | None:
        """Which idle context a runner for ``context_ids`` takes (None: a new one), as llama-server keeps slots: one
        whose tokens the prompt goes on from (``GOES_ON``: a chat's next turn; an empty one counts); else a new one
        while fewer than ``max_idle`` wait, so the conversations in them keep their place; else the one whose reuse
        costs least: the prompt's tokens it lacks (prefilled now) and the tokens it holds beyond the shared prefix
        (lost: prefilled again if their conversation comes back), the least recently let go of on a tie. So a prompt
        that shares only the chat template's opening with a long conversation (a re-measure's, a new chat's) takes a
        short or empty context, not the conversation (llama-server moves a slot it would mostly lose to its prompt
        cache instead). A runner that empties its context (no ``context_ids``) costs what the context holds."""
        ids = context_ids or []
        shared = [common_prefix(tokens, ids) for _, _, tokens, _ in self._idle]
        goes_on = [i for i, n in enumerate(shared) if ids and n >= GOES_ON * len(self._idle[i][2])]
        if goes_on:
            return max(goes_on, key=lambda i: (shared[i], i))
        if len(self._idle) < self.settings.max_idle:
            return None
        return min(range(len(shared)), key=lambda i: (len(ids) + len(self._idle[i][2]) - 2 * shared[i], i))

    @contextmanager
    def forward_clock(self, total: list[float]) -> Iterator[list[float]]:
        """Inside ``llama_decode`` (the batch filling and the logits copy count as outside). Every GGUF model of the
        process shares the ``llama_cpp`` module, so a second model timing into the same ``total`` adds no clock."""
        lib, decode = self.lib, self.lib.llama_decode
        if getattr(decode, "total", None) is total:
            yield total
            return

        def timed(ctx, batch):
            start = time.perf_counter()
            try:
                return decode(ctx, batch)
            finally:
                total[0] += time.perf_counter() - start
        timed.total = total
        lib.llama_decode = timed
        try:
            yield total
        finally:
            lib.llama_decode = decode

    def forget_prompts(self) -> None:
        """Empty every idle context, so the next runner starts as a new request does (the bench's fresh state);
        contexts held by runners are left alone."""
        with self._lock:
            for ctx, _, tokens, widths in self._idle:
                self.lib.llama_memory_clear(self.lib.llama_get_memory(ctx), True)
                tokens.clear()
                widths.clear()

    def _release(self, ctx, batch, tokens: list[int], widths: list[int], emptied: bool) -> None:
        with self._lock:
            if emptied:  # what it holds is asked for by no one: first to be reused or freed
                self._idle.insert(0, (ctx, batch, tokens, widths))
            else:
                self._idle.append((ctx, batch, tokens, widths))
            freed = self._idle[:-self.settings.max_idle] if len(self._idle) > self.settings.max_idle else []
            del self._idle[:len(freed)]
        for old_ctx, old_batch, *_ in freed:  # held by no runner: no forward can be running on it
            self.lib.llama_batch_free(old_batch)
            self.lib.llama_free(old_ctx)

    @property
    def idle_contexts(self) -> int:
        """How many contexts wait in the pool (at most ``settings.max_idle``)."""
        return len(self._idle)

    def context_params(self):
        """llama.cpp's context parameters for this model's settings (bench/speed/node_diff.py adds an eval
        callback to them)."""
        lib, params = self.lib, self.lib.llama_context_default_params()
        params.n_ctx = params.n_batch = self.n_ctx  # one llama_decode per forward: only its logits stay readable
        params.n_threads = params.n_threads_batch = self.threads
        params.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.settings.flash_attn
                                  else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        params.type_k, params.type_v = KV_TYPES[self.settings.cache_k], KV_TYPES[self.settings.cache_v]
        params.no_perf = True
        return params

    def _new_context(self, params=None):
        ctx = self.lib.llama_init_from_model(self.model, params or self.context_params())
        if not ctx:
            raise MemoryError(f"llama.cpp could not make a {self.n_ctx}-token context for {self.path.name}")
        return ctx, self.lib.llama_batch_init(self.n_ctx, 0, 1)

    def tokenize(self, text: str, special: bool = True) -> list[int]:
        """llama.cpp's own tokenizer (tests compare it with the HF tokenizer's ids); ``special``: markers in
        ``text`` become control tokens, as a rendered chat template needs."""
        lib, data = self.lib, text.encode("utf-8")
        vocab = lib.llama_model_get_vocab(self.model)
        out = (lib.llama_token * (len(data) + 8))()
        n = lib.llama_tokenize(vocab, data, len(data), out, len(out), False, special)
        return list(out[:n])


def _free_model(lib, model, idle: list[tuple]) -> None:
    for ctx, batch, *_ in idle:
        lib.llama_batch_free(batch)
        lib.llama_free(ctx)
    idle.clear()
    lib.llama_model_free(model)
