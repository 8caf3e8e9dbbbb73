"""The paths of ``bench.speed.serving``: the app launched, its Chat tab in headless Chromium (serving_browser.py),
its ``/v1``, the engine in this process and llama-server, each able to prime its KV cache with a conversation and
answer one turn; ``/v1`` again beside the floor page; and the CPU seconds of processes, read from /proc."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
import time
import urllib.request
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx

from bench.peer.server import INSTALL_HINT, LlamaServer, ServerConfig, find_llama_server, free_port
from bench.speed.mode_runs import decode_rate
from bench.speed.serving_browser import CHROMIUM, Browser

PRIME = "."  # the other message of a primer: its request puts the history in the path's KV cache
# /v1's OpenAI ``user``: its own scope of the app's memory of earlier answers (engine/proposers/memory.py), as a
# script's; the browser's chat drafts from its own answers only, not from /v1's answer to the same message
V1_USER = "serving-bench"
BESIDE_USER = V1_USER + "-beside-floor"  # floor-v1's scope: it drafts from its own earlier answers, as v1 does
STARTUP_S = 900

def cpu_seconds(pids) -> float:
    """User and system CPU seconds of the processes ``pids`` (Linux /proc)."""
    total, tick = 0.0, os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def chromium_pids() -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if "chrom" in (entry / "comm").read_text():
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


def post_json(client: httpx.Client, url: str, body: dict, timeout: float = 600.0) -> dict:
    response = client.post(url, json=body, timeout=timeout)
    response.raise_for_status()
    return response.json()


def stream_sse(client: httpx.Client, url: str, body: dict, timeout: float = 1800.0) -> dict:
    """POST a streamed OpenAI request; the bench's clock from before the request to each content chunk. ``client``
    keeps its connections between requests, as the openai package's does (a script's requests after its first
    reuse one)."""
    began, first, text, usage, timings = time.perf_counter(), None, [], None, None
    with client.stream("POST", url, json={**body, "stream": True}, timeout=timeout) as response:
        response.raise_for_status()
        for raw in response.iter_lines():
            line = raw.strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: "):])
            usage = chunk.get("usage") or usage
            timings = chunk.get("timings") or timings
            for choice in chunk.get("choices") or ():
                piece = (choice.get("delta") or {}).get("content") or choice.get("text") or ""
                if piece:
                    first = first if first is not None else time.perf_counter() - began
                    text.append(piece)
    seconds = time.perf_counter() - began
    tokens = (usage or {}).get("completion_tokens") or (timings or {}).get("predicted_n") or 0
    return {"text": "".join(text), "tokens": tokens, "seconds": seconds, "ttft_s": first,
            "decode_tokens_per_s": decode_rate(tokens, seconds, first)}


def app_identity(url: str) -> dict:
    """The target's ``x_identity`` on the app's ``/v1/models``: its figures' state, the verify mode and its note."""
    with urllib.request.urlopen(url + "/v1/models", timeout=2) as response:
        return json.loads(response.read())["data"][0].get("x_identity") or {}


def wait_measured(url: str, proc: subprocess.Popen, log: str, what: str) -> None:
    """Until the app serves with its figures in (nothing measures beside the bench), or exit saying ``what``."""
    deadline = time.monotonic() + STARTUP_S
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            if not app_identity(url).get("measuring"):
                return
        except OSError:
            pass
        time.sleep(1)
    sys.exit(f"launch.py exited with {proc.returncode}: see {log}" if proc.poll() is not None else
             f"launch.py did not {what} within {STARTUP_S} s: see {log}")


@contextmanager
def launched_app(app_dir: Path, cache_dir: str | None, pair: list[str], semantic_cache: bool = False,
                 verify_mode: str | None = None):
    """``launch.py --no-browser`` (``--no-semantic-cache`` unless ``semantic_cache``) from ``app_dir`` on a free port
    with the ``pair`` options, once its figures are in (with ``verify_mode``: once in that mode); yields (url, pid)."""
    port = free_port()
    command = [sys.executable, "launch.py", "--no-browser", *([] if semantic_cache else ["--no-semantic-cache"]),
               "--port", str(port), *pair]
    if cache_dir:
        command += ["--cache-dir", cache_dir]
    log = open(Path(os.environ.get("TMPDIR", "/tmp")) / f"speclens-serving-{port}.log", "w")
    proc = subprocess.Popen(command, cwd=app_dir, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_measured(url, proc, log.name, "serve with its figures")
        if verify_mode:  # the model panel's choice, through Gradio's API as the panel makes it; then its figures
            from gradio_client import Client

            Client(url, verbose=False).predict(verify_mode, api_name="/set_verify_mode")
            wait_measured(url, proc, log.name, f"measure its figures in verify mode {verify_mode}")
            if (identity := app_identity(url)).get("verify_mode") != verify_mode:
                sys.exit(f"the app did not switch to verify mode {verify_mode} (it has no such choice): {identity}")
        yield url, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


class Paths:
    """The four paths, each able to prime its KV cache with a history and to answer one turn."""

    def __init__(self, stack: ExitStack, args, modes: list[str]):
        self.modes, self.max_new_tokens = modes, args.max_new_tokens
        pair = ["--target", args.target, "--draft", args.draft]
        self.url, self.app_pid = stack.enter_context(launched_app(Path(args.app_dir), args.cache_dir, pair,
                                                                  verify_mode=args.verify_mode))
        self.client = stack.enter_context(httpx.Client())  # the text paths' client: one kept connection per server
        self.browser = Browser(stack, self.url, args.max_new_tokens) if "browser" in modes else None
        self.floor = None
        if "floor" in modes or "floor-v1" in modes:
            from bench.speed.serving_floor import FloorPage

            self.floor = FloorPage(stack, self.browser.browser)
        from engine.chat_engine import ChatEngine  # the in-process engine, and the tokenizer for llama-server

        self.engine = ChatEngine(cache_dir=Path(args.cache_dir) if args.cache_dir else None, measure_beside=False)
        self.engine.load_pair(args.target, args.draft)
        if args.verify_mode:
            self.engine.set_verify_mode(args.verify_mode)
        self.peer = None
        if "llama-server" in modes:
            from engine.models.catalog import model_gguf

            binary = find_llama_server(args.llama_server)
            if binary is None:
                sys.exit(f"no llama-server found: {INSTALL_HINT}")
            gguf = model_gguf(args.target, Path(args.cache_dir) if args.cache_dir else None)
            if gguf is None:
                sys.exit(f"{args.target} has no GGUF file for llama-server to run")
            threads = args.threads or self.engine.target.backend.threads
            self.peer = stack.enter_context(LlamaServer(ServerConfig(binary, gguf, threads=threads, context=8192)))

    def prime(self, mode: str, history: list[dict]) -> None:
        """Put ``history`` in the KV cache of a text path (not the browser's: its chat keeps its own), as its next
        turn finds it: an untimed one-token request of it and another message. No history, nothing to put."""
        if mode == "browser":
            raise ValueError("the browser's chat keeps its own conversation: nothing primes it")
        if not history:
            return
        messages = [*history, {"role": "user", "content": PRIME}]
        if mode in ("v1", "floor-v1"):
            post_json(self.client, self.url + "/v1/chat/completions",
                      {"messages": messages, "max_tokens": 1, "temperature": 0,
                       "user": BESIDE_USER if mode == "floor-v1" else V1_USER})
        elif mode == "engine":
            from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig

            for _ in self.engine.generate(messages, SamplingConfig(max_new_tokens=1), DEFAULT_SPEC, cache=CACHE_OFF):
                pass
        else:
            post_json(self.client, self.peer.url + "/v1/completions",
                      {"prompt": self.engine.encode(messages), "max_tokens": 1, "temperature": 0, "cache_prompt": True})

    def run(self, mode: str, messages: list[dict], profile: bool = False) -> dict:
        if mode == "browser":
            return self._with_cpu(lambda: self.browser.ask(messages[-1]["content"], profile))
        if mode == "v1":
            return self._with_cpu(lambda: self._v1_run(messages, V1_USER))
        if mode == "engine":
            return self._engine_run(messages)
        return stream_sse(self.client, self.peer.url + "/v1/completions",
                          {"prompt": self.engine.encode(messages), "max_tokens": self.max_new_tokens,
                           "temperature": 0, "top_k": 1, "cache_prompt": True})

    def _with_cpu(self, answer) -> dict:
        """``answer()``'s run, with the CPU seconds the app and Chromium took meanwhile."""
        app_cpu, chromium = cpu_seconds([self.app_pid]), chromium_pids()
        browser_cpu = cpu_seconds(chromium)
        run = answer()
        return {**run, "app_cpu_s": cpu_seconds([self.app_pid]) - app_cpu,
                "browser_cpu_s": cpu_seconds(chromium) - browser_cpu}

    def floor_run(self, tokens: int, rate: float, profile: bool = False) -> dict:
        """The floor page's answer of ``tokens`` spans at ``rate``, and the CPU seconds Chromium took meanwhile."""
        chromium = chromium_pids()
        browser_cpu = cpu_seconds(chromium)
        run = self.floor.ask(tokens, rate, profile)
        run["browser_cpu_s"] = cpu_seconds(chromium) - browser_cpu
        return run

    def beside_floor_run(self, messages: list[dict], tokens: int, rate: float, wait_s: float) -> dict:
        """The app's ``/v1`` answer (as its own user) while the floor page streams beside it: ``tokens`` spans at
        ``rate`` (v1's answer alone: as many as it had, at its decode rate), and the spans ``rate`` makes in
        ``wait_s`` (its first token's wait) more, so the page draws until the answer's last token. The answer runs
        on a thread of its own (Playwright drives the page from this one); the CPU seconds the app and Chromium took
        meanwhile, as for v1."""
        return self._with_cpu(lambda: self._beside_floor(messages, tokens + math.ceil(rate * wait_s), rate))

    def _beside_floor(self, messages: list[dict], spans: int, rate: float) -> dict:
        box = {}
        answer = threading.Thread(target=lambda: box.update(self._v1_run(messages, BESIDE_USER)))
        answer.start()
        try:
            self.floor.ask(spans, rate)
        finally:
            answer.join()
        if not box:
            raise RuntimeError("the /v1 answer beside the floor page failed: see the app's log")
        return box

    def _v1_run(self, messages: list[dict], user: str) -> dict:
        return stream_sse(self.client, self.url + "/v1/chat/completions",
                          {"messages": messages, "max_tokens": self.max_new_tokens, "temperature": 0, "user": user,
                           "stream_options": {"include_usage": True}})

    def _engine_run(self, messages: list[dict]) -> dict:
        from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig

        began, first, done = time.perf_counter(), None, None
        for event in self.engine.generate(messages, SamplingConfig(max_new_tokens=self.max_new_tokens), DEFAULT_SPEC,
                                          cache=CACHE_OFF):
            if event.type == "token" and first is None:
                first = time.perf_counter() - began
            elif event.type == "done":
                done = event
        seconds = time.perf_counter() - began
        tokens = len(done.token_ids)
        return {"text": done.text, "tokens": tokens, "seconds": seconds, "ttft_s": first,
                "decode_tokens_per_s": decode_rate(tokens, seconds, first)}
