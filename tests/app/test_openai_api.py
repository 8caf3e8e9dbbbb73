"""The OpenAI-compatible routes: wire format on a fake engine (fast), then the official client against launch.py."""
from __future__ import annotations

import json
import math
import socket
import threading
import urllib.request

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from app.context import AppContext
from app.api.openai_routes import add_openai_routes
from app.api.openai_format import Release
from app.api.openai_request import OPENAI_TEMPERATURE
from engine.config import DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, SamplingConfig
from engine.events import Acceptance, CacheEvent, DoneEvent, StatsEvent
from tests.helpers.fakes import PIECES, PiecesEngine
from tests.helpers.fakes import piece as tok
from tests.helpers.server import serving
from tests.helpers.constants import SMOL

FakeEngine = PiecesEngine  # what most tests here ask


def client(api_key=None):
    engine = FakeEngine()
    app = add_openai_routes(FastAPI(), AppContext(engine), api_key)
    return TestClient(app, raise_server_exceptions=False), engine


def ask(**kw):
    return {"model": "tgt", "messages": [{"role": "user", "content": "hi"}], **kw}


def sse_chunks(response) -> list:
    lines = [line[len("data: "):] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_non_streamed_completion_carries_text_speculation_and_usage():
    c, engine = client()
    r = c.post("/v1/chat/completions", json=ask(temperature=0, max_tokens=20, seed=3))
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "chat.completion" and body["model"] == "tgt"
    choice = body["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": "Hello world! END more"}
    assert choice["finish_reason"] == "length"
    assert [s["kind"] for s in choice["speculation"]] == [k for _, k in PIECES]
    assert choice["speculation"][1] == {"kind": "corrected", "text": " wor", "token_id": 1, "p_target": 0.5,
                                        "q_draft": 0.25}
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8, "proposed": 4,
                             "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0,
                                                           "accepted_prediction_tokens": 0,
                                                           "rejected_prediction_tokens": 0},
                             "accepted": 3, "acceptance_rate": 0.75}
    sampling = engine.calls[0]["sampling"]
    assert (sampling.temperature, sampling.max_new_tokens, sampling.seed) == (0.0, 20, 3)
    assert engine.calls[0]["cache"] == DEFAULT_CACHE and engine.calls[0]["spec"] == DEFAULT_SPEC  # as a browser chat


def test_what_a_request_leaves_out_is_the_engine_default_or_openai_temperature():
    c, engine = client()
    assert c.post("/v1/chat/completions", json=ask()).status_code == 200
    assert engine.calls[0]["sampling"] == SamplingConfig(temperature=OPENAI_TEMPERATURE,
                                                         max_new_tokens=DEFAULT_SAMPLING.max_new_tokens)


def test_stop_string_cuts_the_text_and_the_tokens_and_stops_the_engine():
    c, _ = client()
    body = c.post("/v1/chat/completions", json=ask(stop=["END", "zzz"])).json()
    choice = body["choices"][0]
    assert choice["message"]["content"] == "Hello world! "
    assert choice["finish_reason"] == "stop"
    assert "".join(s["text"] for s in choice["speculation"]) == "Hello world! "
    assert body["usage"]["completion_tokens"] == 4  # the cut token counts, the one after it never ran


def test_streamed_chunks_end_with_done_and_add_up_to_the_answer():
    c, _ = client()
    with c.stream("POST", "/v1/chat/completions", json=ask(stream=True, stop="ld!")) as r:
        r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = sse_chunks(r)
    assert all(ch["object"] == "chat.completion.chunk" for ch in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert text == "Hello wor"  # "ld" was held back: it could have begun the stop string, and it did
    kinds = [s["kind"] for ch in chunks for s in ch["choices"][0]["speculation"]]
    assert kinds == ["accepted", "corrected"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert not any("usage" in ch for ch in chunks)  # only stream_options.include_usage asks for it
    assert all(ch["choices"][0]["logprobs"] is None for ch in chunks)  # nor were logprobs asked for


def test_include_usage_sends_a_last_chunk_with_no_choices_and_the_usage():
    """OpenAI's stream_options.include_usage: every chunk has ``usage`` null, then one more chunk (choices [])
    carries the request's usage, just before [DONE]."""
    c, _ = client()
    with c.stream("POST", "/v1/chat/completions",
                  json=ask(stream=True, stop="ld!", stream_options={"include_usage": True})) as r:
        r.read()
    *answer, last = sse_chunks(r)
    assert last["choices"] == [] and last["object"] == "chat.completion.chunk"
    assert last["usage"]["completion_tokens"] == 2 and last["usage"]["prompt_tokens"] == 3
    assert answer[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" in ch and ch["usage"] is None for ch in answer)


@pytest.mark.parametrize("stop", [None, "ld!"])
def test_logprobs_come_in_openai_shape_with_the_kind_beside_in_the_whole_and_the_streamed_answer(stop):
    c, engine = client()
    request = ask(logprobs=True, top_logprobs=2, stop=stop)
    whole = c.post("/v1/chat/completions", json=request).json()["choices"][0]
    assert engine.calls[0]["sampling"].candidates == 2  # asked of the engine
    content = whole["logprobs"]["content"]
    assert [e["kind"] for e in content] == [s["kind"] for s in whole["speculation"]]
    assert [e["token"] for e in content] == [t for t, _ in PIECES[:len(content)]]
    assert all(e["bytes"] == list(e["token"].encode()) and e["logprob"] == pytest.approx(math.log(0.5))
               for e in content)
    assert [[(t["token"], t["logprob"]) for t in e["top_logprobs"]] for e in content] == \
        [[("alt0", pytest.approx(math.log(0.25))), ("alt1", pytest.approx(math.log(0.125)))]] * len(content)
    with c.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as r:
        r.read()
    chunks = sse_chunks(r)
    streamed = [e for ch in chunks if ch["choices"][0]["logprobs"] for e in ch["choices"][0]["logprobs"]["content"]]
    assert streamed == content
    assert all(bool(ch["choices"][0]["logprobs"]) == bool(ch["choices"][0]["speculation"]) for ch in chunks)


def test_logprobs_without_top_logprobs_asks_for_none_beside_the_token():
    c, engine = client()
    content = c.post("/v1/chat/completions", json=ask(logprobs=True)).json()["choices"][0]["logprobs"]["content"]
    assert engine.calls[0]["sampling"].candidates == 0
    assert len(content) == len(PIECES) and all(e["top_logprobs"] == [] for e in content)
    assert c.post("/v1/chat/completions", json=ask()).json()["choices"][0]["logprobs"] is None
    assert engine.calls[1]["sampling"].candidates is None


def test_the_engine_reports_the_prompt_length_on_its_done_event():
    """What usage.prompt_tokens reads: the generation's own count, from the prompt it encoded once."""
    from engine.chat_engine import ChatEngine
    from engine.config import CACHE_OFF
    from engine.events import final_done
    from tests.helpers.tiny import tiny_pair

    engine = ChatEngine()
    engine.use_models(*tiny_pair())
    messages, sampling = [{"role": "user", "content": "hello there"}], SamplingConfig(max_new_tokens=3)
    n = len(engine.encode(messages))
    assert n > 0
    assert final_done(engine.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF)).prompt_tokens == n
    assert final_done(engine.generate_reference(messages, sampling)).prompt_tokens == n


def test_release_holds_back_a_possible_stop_prefix_then_lets_it_go():
    release = Release(("END",))
    assert release.add(tok("ab E")) == ("ab ", [])  # "E" may begin "END"
    delta, entries = release.add(tok("Nx"))  # "ENx" is no stop: all of it goes
    assert delta == "ENx" and [e["text"] for e in entries] == ["ab E", "Nx"]
    assert release.finish() == ("", [])


def test_models_list_the_loaded_pair():
    c, _ = client()
    data = c.get("/v1/models").json()["data"]
    assert [(m["id"], m["x_role"]) for m in data] == [("tgt", "target"), ("drf", "draft")]


@pytest.mark.parametrize("payload, status, param", [
    ({"model": "tgt"}, 422, "messages"),  # missing field
    (ask(temperature="hot"), 422, "temperature"),  # wrong type
    ({"model": "tgt", "messages": [{"role": "user", "content": "  "}]}, 400, None),  # the engine: empty prompt
    (ask(temperature=9), 400, "temperature"),
    (ask(temperature=2.5), 400, "temperature"),  # within the engine's range, outside OpenAI's [0, 2]
    (ask(frequency_penalty=0.5), 400, "frequency_penalty"),  # each changes the answer: refused, not ignored
    (ask(presence_penalty=-1), 400, "presence_penalty"),
    (ask(logit_bias={"42": 100}), 400, "logit_bias"),
    (ask(temperature=-0.5), 400, "temperature"),
    (ask(top_p=0), 400, "top_p"),  # the engine's SamplingConfig refuses, the request's parameter is named
    (ask(seed=-1), 400, "seed"),
    (ask(n=2), 400, "n"),
    (ask(stop=["a", "b", "c", "d", "e"]), 400, "stop"),
    ({"model": "tgt", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages"),
    (ask(tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}]), 400, "tools"),
    (ask(tool_choice="auto"), 400, "tool_choice"),
    (ask(tool_choice={"type": "function", "function": {"name": "f"}}), 400, "tool_choice"),
    (ask(functions=[{"name": "f", "parameters": {}}]), 400, "functions"),
    (ask(function_call="auto"), 400, "function_call"),
    (ask(response_format={"type": "json_object"}), 400, "response_format"),
    (ask(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}), 400,
     "response_format"),
    (ask(logprobs=True, top_logprobs=21), 400, "top_logprobs"),  # OpenAI's 0..20
    (ask(top_logprobs=2), 400, "top_logprobs"),  # without logprobs: true
    (ask(stream_options={"include_usage": True}), 400, "stream_options"),  # without stream: true
])
def test_bad_requests_get_openai_error_json(payload, status, param):
    c, _ = client()
    r = c.post("/v1/chat/completions", json=payload)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert "Traceback" not in r.text


def test_malformed_json_is_a_422_not_a_500():
    c, _ = client()
    r = c.post("/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "error" in r.json()


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_limit_of_zero_tokens_is_refused_as_openai_does_not_taken_as_unset(field):
    c, engine = client()
    r = c.post("/v1/chat/completions", json=ask(**{field: 0}))
    assert r.status_code == 400, r.text
    assert "max_new_tokens" in r.json()["error"]["message"] and "got 0" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == field
    assert engine.calls == []  # refused before the engine was asked


@pytest.mark.parametrize("extra", [dict(tool_choice="none"), dict(tools=[], tool_choice="none"),
                                   dict(response_format={"type": "text"}), dict(function_call="none"),
                                   dict(frequency_penalty=0, presence_penalty=0.0, logit_bias={})])
def test_what_changes_nothing_is_not_refused(extra):
    c, _ = client()
    assert c.post("/v1/chat/completions", json=ask(**extra)).status_code == 200


def test_the_key_is_checked_before_the_request_is_read():
    """Without the key nothing about the request matters: malformed JSON, a bad field, an unknown route: 401."""
    c, engine = client(api_key="s3cret")
    for method, path, body in [("POST", "/v1/chat/completions", b"{not json"),
                               ("POST", "/v1/chat/completions", json.dumps({"model": "tgt"}).encode()),
                               ("GET", "/v1/no-such-route", None)]:
        r = c.request(method, path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, body, r.text)
    keyed = {"content-type": "application/json", "Authorization": "Bearer s3cret"}
    assert c.post("/v1/chat/completions", content=b"{not json", headers=keyed).status_code == 422
    assert engine.calls == []


def _server_with_ui(api_key=None):
    """The real server (create_server): the /v1 routes with a Gradio UI mounted at "/" behind them."""
    import gradio as gr
    from app.api.openai_routes import create_server

    engine = FakeEngine()
    with gr.Blocks() as demo:
        gr.Markdown("the UI")
    return create_server(AppContext(engine), demo, api_key), engine


@pytest.mark.parametrize("method, path, status, allow", [
    ("GET", "/v1/no-such-route", 404, None),
    ("POST", "/v1/completions", 404, None),
    ("GET", "/v1", 404, None),
    ("POST", "/v1/models", 405, "GET"),
    ("GET", "/v1/chat/completions", 405, "POST"),
])
def test_unknown_routes_and_wrong_methods_under_v1_get_openai_errors_not_the_ui(method, path, status, allow):
    app, _ = _server_with_ui()
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.request(method, path)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and path in error["message"]
    assert r.headers.get("allow") == allow


class EndlessEngine(FakeEngine):
    """Yields tokens until cancelled; says when it started and when its generation ended, and how. Like the
    engine's, its generation runs ahead on a worker of its own (engine/serve/run_ahead.py): nobody has to read it
    for it to see a cancel and end."""

    def __init__(self):
        super().__init__()
        self.started, self.stopped, self.finish = threading.Event(), threading.Event(), None

    def generate(self, messages, sampling, spec, *, cache=DEFAULT_CACHE, cancel=None, prediction="", memory_scope=""):
        from engine.serve.run_ahead import run_ahead

        self.calls.append(dict(messages=messages, sampling=sampling, spec=spec, cache=cache))
        yield from run_ahead(self._endless(cancel), cancel)

    def _endless(self, cancel):
        yield CacheEvent("off")
        n = 0
        try:
            while not cancel.is_set():
                yield tok("la ", "plain", n)
                n += 1
                self.started.set()
                cancel.wait(0.01)  # a step's worth of work, cut short by a cancel (it synchronises nothing)
            self.finish = "cancelled"
            yield DoneEvent("cancelled", "la " * n, tuple(range(n)), StatsEvent(n, 0.1, 4, Acceptance(steps=1)),
                            prompt_tokens=self.PROMPT_TOKENS)
        finally:
            self.stopped.set()


def _post(conn: socket.socket, body: dict, headers: bytes = b"") -> None:
    data = json.dumps(body).encode()
    conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n%s"
                 b"Content-Length: %d\r\n\r\n%s" % (headers, len(data), data))


def _port(url: str) -> int:
    return int(url.rstrip("/").rsplit(":", 1)[1])


def test_a_client_that_leaves_stops_a_non_streamed_generation():
    """A real server and a client that sends its request, waits until the answer is being generated, and hangs
    up: the generation must end (before the fix it ran on to max_tokens with nobody to read it)."""
    engine = EndlessEngine()
    app = add_openai_routes(FastAPI(), AppContext(engine))
    with serving(app) as url:
        with socket.create_connection(("127.0.0.1", _port(url))) as conn:
            _post(conn, ask(max_tokens=8000))
            assert engine.started.wait(60), "the generation never started"
        assert engine.stopped.wait(60), "the generation went on after its client left"
        assert engine.finish == "cancelled"


def test_a_client_that_leaves_stops_a_streamed_generation():
    """The streamed response: the client reads until its answer's first token has come, then hangs up; the
    engine (stepped by Starlette's thread pool) is cancelled and ends its generation."""
    engine = EndlessEngine()
    app = add_openai_routes(FastAPI(), AppContext(engine))
    with serving(app) as url:
        with socket.create_connection(("127.0.0.1", _port(url))) as conn:
            _post(conn, ask(max_tokens=8000, stream=True))
            received = b""
            while b'"content": "la ' not in received:  # the streamed response says the answer has begun
                chunk = conn.recv(65536)
                assert chunk, f"the server closed the stream before any token: {received[-500:]!r}"
                received += chunk
        assert engine.stopped.wait(60), "the generation went on after its client left"
        assert engine.finish == "cancelled"


@pytest.mark.parametrize("stop", [None, "ld!", ["END", "zzz"], "Hello"])
def test_the_streamed_and_the_whole_answer_are_the_same_answer(stop):
    """One path from events to both responses: the chunks add up to the whole body's text, speculation, finish
    reason and usage, with or without a stop string (also one that cuts at the first token)."""
    c, _ = client()
    whole = c.post("/v1/chat/completions", json=ask(stop=stop)).json()
    with c.stream("POST", "/v1/chat/completions", json=ask(stop=stop, stream=True)) as r:
        r.read()
    chunks = sse_chunks(r)
    choice = whole["choices"][0]
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks) == choice["message"]["content"]
    assert [s for ch in chunks for s in ch["choices"][0]["speculation"]] == choice["speculation"]
    assert chunks[-1]["choices"][0]["finish_reason"] == choice["finish_reason"]
    assert chunks[0]["x_cache"] == whole["x_cache"] and whole["x_cache"]["outcome"] == "off"
    with c.stream("POST", "/v1/chat/completions",
                  json=ask(stop=stop, stream=True, stream_options={"include_usage": True})) as r:
        r.read()
    assert sse_chunks(r)[-1]["usage"] == whole["usage"]


class FailingEngine(FakeEngine):
    """Two tokens, then the engine fails (a bug, a device error) after the response has begun."""

    def generate(self, messages, sampling, spec, *, cache=DEFAULT_CACHE, cancel=None, prediction="", memory_scope=""):
        yield CacheEvent("off")
        yield tok("Hello", "accepted", 0)
        yield tok(" wor", "corrected", 1)
        raise RuntimeError("the device fell over")


def test_a_generation_that_fails_mid_stream_says_so_and_ends_the_stream():
    app = add_openai_routes(FastAPI(), AppContext(FailingEngine()))
    with TestClient(app, raise_server_exceptions=False) as c:
        with c.stream("POST", "/v1/chat/completions",
                      json=ask(stream=True, stream_options={"include_usage": True})) as r:
            r.read()
    chunks = sse_chunks(r)  # ends with [DONE]
    errors = [ch["error"] for ch in chunks if "error" in ch]
    assert len(errors) == 1 and errors[0]["type"] == "server_error"
    assert errors[0]["message"] == "generation failed: the device fell over"
    *answer, last = [ch for ch in chunks if "choices" in ch]
    assert "".join(ch["choices"][0]["delta"].get("content", "") for ch in answer) == "Hello wor"
    assert answer[-1]["choices"][0]["finish_reason"] == "stop"
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 2 and last["usage"]["prompt_tokens"] == 0


def test_api_key_is_required_when_set():
    c, _ = client(api_key="s3cret")
    assert c.get("/v1/models").status_code == 401
    r = c.post("/v1/chat/completions", json=ask(), headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).status_code == 200


# -- the official client against a real launch.py (SmolLM2-135M pair) ------------------------------------------
KEY = "test-key-123"


@pytest.fixture
def live_server(tmp_path_factory):
    """launch.py with the key from a file (so it is not on the command line). One test's: a module's fixture would
    keep it serving, and measuring its own pair, beside this module's later tests, whose real engine then measured
    its pair busy in CI (2 Zen 3 cores: other processes took 27% of the CPUs; its rounds differed by 177%)."""
    from tests.helpers.server import SMOL_PAIR, launched

    cache_dir = tmp_path_factory.mktemp("speclens-api")
    key_file = tmp_path_factory.mktemp("secrets") / "api-key"
    key_file.write_text(KEY + "\n")
    with launched(cache_dir, *SMOL_PAIR, "--api-key-file", str(key_file), figures=False) as url:
        yield url


@pytest.mark.real
def test_openai_client_chats_like_the_app(live_server):
    openai = pytest.importorskip("openai")
    from gradio_client import Client

    prompt, n = "Write a Python function that adds two numbers.", 24
    expected = Client(live_server, auth=("me", KEY), verbose=False).predict(
        prompt, max_new_tokens=n, temperature=0.0, cache=False, api_name="/chat")["text"]
    client = openai.OpenAI(base_url=f"{live_server}v1", api_key=KEY)
    assert [m.id for m in client.models.list().data] == [SMOL] * 2
    messages = [{"role": "user", "content": prompt}]
    whole = client.chat.completions.create(model=SMOL, messages=messages, temperature=0,
                                           max_tokens=n)
    assert whole.choices[0].message.content == expected and expected.strip()
    assert whole.usage.completion_tokens == n and whole.usage.prompt_tokens > 0
    kinds = {s["kind"] for s in whole.choices[0].speculation}
    assert kinds <= {"accepted", "corrected", "bonus", "plain", "cached"} and kinds
    stream = client.chat.completions.create(model=SMOL, messages=messages, temperature=0,
                                            max_tokens=n, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected

    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "   "}])
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{live_server}v1", api_key="wrong").models.list()


class Watched:
    """An engine's ``generate``, watched from the test: ``started`` once its first token is out, ``stopped`` once
    the generation has ended (its DoneEvent in ``done``). Synchronisation by events, not by sleeping."""

    def __init__(self, generate):
        self.inner = generate
        self.started, self.stopped, self.done = threading.Event(), threading.Event(), None

    def __call__(self, *args, **kwargs):
        try:
            for event in self.inner(*args, **kwargs):
                if event.type == "done":
                    self.done = event
                yield event
                if event.type == "token":
                    self.started.set()
        finally:
            self.stopped.set()


@pytest.mark.real
def test_a_client_that_leaves_stops_its_answer_on_real_weights(real_models):
    """The real engine (SmolLM2-135M) behind the app's whole server (create_server with the UI, as launch.py
    builds it): a non-streamed request whose client hangs up once its answer is being generated stops
    generating, cancelled with fewer tokens than asked, and the server goes on answering."""
    from app.api.openai_routes import create_server
    from app.ui import build_demo, launch_kwargs

    engine = real_models.engine(SMOL, "bf16", SMOL, "bf16")
    engine.generate = watched = Watched(engine.generate)  # the app reads engine.generate: this is what it calls
    ctx = AppContext(engine)
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=1)
    prompt = "Count from 1 to 5000, one number per line."
    with serving(create_server(ctx, demo, KEY, **launch_kwargs())) as url:
        with socket.create_connection(("127.0.0.1", _port(url))) as conn:
            _post(conn, ask(max_tokens=4000, temperature=0, messages=[{"role": "user", "content": prompt}]),
                  b"Authorization: Bearer %s\r\n" % KEY.encode())
            assert watched.started.wait(300), "the generation never started"
        assert watched.stopped.wait(300), "the generation did not stop after its client left"
        assert watched.done.finish_reason == "cancelled" and 0 < len(watched.done.token_ids) < 4000
        models = urllib.request.Request(f"{url}v1/models", headers={"Authorization": f"Bearer {KEY}"})
        with urllib.request.urlopen(models, timeout=60) as r:
            assert r.status == 200


def test_v1_carries_the_pairs_identity_check_and_runner():
    """The load-time check's result (PairInfo.bit_identical and its sentence): in /v1/models, in a whole answer, and
    in the first chunk of a streamed one; what runs the models and why these precisions: in /v1/models."""
    from dataclasses import replace

    class CheckedEngine(FakeEngine):
        def info(self):
            return replace(super().info(), bit_identical=True, identity_note="verified bit-identical on this machine: "
                           "9/9 rows", runner="llama.cpp 2 threads, flash attention on, repack off",
                           precision_note="AVX2 CPU -> target gguf (auto), draft gguf (auto): why",
                           verify_mode=self.verify_mode, verify_note="verify widths: identical 9 tok/s, fastest 9.1")

    engine = CheckedEngine()
    c = TestClient(add_openai_routes(FastAPI(), AppContext(engine)), raise_server_exceptions=False)
    expected = {"bit_identical": True, "check": "verified bit-identical on this machine: 9/9 rows",
                "measuring": False, "measured": engine.info().checks_note,
                "verify_mode": "identical", "verify": engine.info().verify_note}  # the mode where one is offered
    target, draft = c.get("/v1/models").json()["data"]
    assert target["x_identity"] == expected and "x_identity" not in draft
    assert target["x_runner"].startswith("llama.cpp 2 threads")
    assert target["x_precision_note"] == draft["x_precision_note"] == engine.info().precision_note  # auto's why
    assert c.post("/v1/chat/completions", json=ask(max_tokens=5)).json()["x_identity"] == expected
    chunks = sse_chunks(c.post("/v1/chat/completions", json=ask(max_tokens=5, stream=True)))
    assert chunks[0]["x_identity"] == expected and all("x_identity" not in ch for ch in chunks[1:])
    engine.set_verify_mode("fastest")
    assert c.get("/v1/models").json()["data"][0]["x_identity"]["verify_mode"] == "fastest"



def test_v1_says_the_figures_are_being_measured_and_claims_no_identity_meanwhile():
    from tests.helpers.fakes import FakeEngine as ReplayEngine

    engine = ReplayEngine([])
    engine.measuring = True  # served before the pair's figures are in
    c = TestClient(add_openai_routes(FastAPI(), AppContext(engine)), raise_server_exceptions=False)
    measuring = c.get("/v1/models").json()["data"][0]["x_identity"]
    assert measuring["measuring"] and not measuring["bit_identical"] and "verify_mode" not in measuring


@pytest.mark.parametrize("prediction, text", [
    ({"type": "content", "content": "def add(a, b):\n    return a + b\n"}, "def add(a, b):\n    return a + b\n"),
    ({"type": "content", "content": [{"type": "text", "text": "def "}, {"type": "text", "text": "add"}]}, "def add"),
    (None, ""),
])
def test_a_prediction_reaches_the_engine_as_its_text(prediction, text):
    c, engine = client()
    r = c.post("/v1/chat/completions", json=ask(**({"prediction": prediction} if prediction else {})))
    assert r.status_code == 200 and engine.calls[0]["prediction"] == text


def test_each_api_user_drafts_from_their_own_memory_of_earlier_answers():
    c, engine = client()
    assert c.post("/v1/chat/completions", json=ask(user="ana")).status_code == 200
    assert c.post("/v1/chat/completions", json=ask()).status_code == 200
    assert [call["memory_scope"] for call in engine.calls] == ["user:ana", ""]


@pytest.mark.parametrize("prediction", [
    {"type": "text", "content": "x"}, {"content": "x"}, {"type": "content"}, {"type": "content", "content": 3},
    {"type": "content", "content": [{"type": "image_url", "image_url": {}}]}, {"type": "content", "content": ["x"]},
])
def test_a_malformed_prediction_is_a_bad_request_naming_it(prediction):
    c, engine = client()
    r = c.post("/v1/chat/completions", json=ask(prediction=prediction))
    assert r.status_code == 400 and r.json()["error"]["param"] == "prediction" and not engine.calls
