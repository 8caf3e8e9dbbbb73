"""/v1 as OpenAI clients use it: the official ``openai`` client and LangChain's ChatOpenAI against the app's whole
server (create_server with the UI, as launch.py builds it) on real SmolLM2-135M weights, with a semantic cache.

The logprobs are checked against the target itself: one plain forward over the prompt and the answer (no KV
cache, no speculation) gives the distribution each token must report. The target runs in fp32, so the two agree
to rounding."""
from __future__ import annotations

import math

import pytest
import torch

from app.context import AppContext
from tests.helpers.server import serving
from tests.helpers.constants import SMOL

pytestmark = pytest.mark.real
KEY = "test-key-456"
PROMPT = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
N_TOKENS = 8  # every answer here but the cached one is cut by this limit, so none is stored in the cache
TOL = 1e-3


@pytest.fixture(scope="module")
def server(real_models, tmp_path_factory):
    """(url, engine): the real engine (fp32 target, bf16 draft; a semantic cache with the MiniLM embedder) behind
    the app's server."""
    from app.api.openai_routes import create_server
    from app.ui import build_demo, launch_kwargs
    from engine.cache.embedder import load_default_embedder
    from engine.cache.semantic_cache import SemanticCache

    cache = SemanticCache(tmp_path_factory.mktemp("v1-cache") / "cache", load_default_embedder())
    engine = real_models.engine(SMOL, "fp32", SMOL, "bf16", cache=cache)
    ctx = AppContext(engine)
    demo = build_demo(ctx)
    demo.queue(default_concurrency_limit=1)
    with serving(create_server(ctx, demo, KEY, **launch_kwargs())) as url:
        yield url, engine


@pytest.fixture(scope="module")
def openai_client(server):
    import openai  # the test extra has it, as it has langchain-openai: a missing one fails, never skips

    return openai.OpenAI(base_url=f"{server[0]}v1", api_key=KEY)


def target_logprobs(engine, messages, token_ids, temperature=1.0) -> torch.Tensor:
    """(answer, vocab): the target's log-distribution before each answer token, at ``temperature``."""
    prompt = engine.encode(messages)
    with torch.no_grad():
        logits = engine.target.model(torch.tensor([prompt + token_ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits / temperature, dim=-1)


def check_against_target(content: list[dict], token_ids: list[int], expected: torch.Tensor, n_top: int) -> None:
    """Each entry's logprob is the target's for its token, and its top_logprobs the target's most likely there."""
    assert len(content) == len(token_ids) == len(expected)
    for entry, token, row in zip(content, token_ids, expected):
        assert entry["logprob"] == pytest.approx(float(row[token]), abs=TOL)
        assert [t["logprob"] for t in entry["top_logprobs"]] == pytest.approx(torch.topk(row, n_top).values.tolist(),
                                                                             abs=TOL)


def joined_bytes(content: list[dict]) -> str:
    return bytes(b for entry in content for b in entry["bytes"]).decode("utf-8")


def test_openai_client_gets_the_targets_logprobs_with_the_kind_beside(server, openai_client):
    url, engine = server
    reply = openai_client.chat.completions.create(model=SMOL, messages=PROMPT, temperature=0, max_tokens=N_TOKENS,
                                                  logprobs=True, top_logprobs=3)
    choice = reply.choices[0]
    content = [e.model_dump() for e in choice.logprobs.content]
    speculation = choice.speculation
    assert choice.finish_reason == "length" and len(content) == reply.usage.completion_tokens == len(speculation)
    assert joined_bytes(content) == choice.message.content and choice.message.content.strip()
    assert [e["kind"] for e in content] == [s["kind"] for s in speculation]
    assert {e["kind"] for e in content} <= {"accepted", "corrected", "bonus", "plain"}
    token_ids = [s["token_id"] for s in speculation]
    check_against_target(content, token_ids, target_logprobs(engine, PROMPT, token_ids), 3)
    for entry, spec in zip(content, speculation):
        assert math.exp(entry["logprob"]) == pytest.approx(spec["p_target"], rel=1e-4)
        assert entry["token"] == entry["top_logprobs"][0]["token"]  # greedy: the argmax
        assert entry["logprob"] == pytest.approx(entry["top_logprobs"][0]["logprob"])


def test_openai_client_streams_logprobs_after_temperature_and_a_last_usage_chunk(server, openai_client):
    url, engine = server
    chunks = list(openai_client.chat.completions.create(
        model=SMOL, messages=PROMPT, temperature=0.7, seed=7, max_tokens=N_TOKENS, logprobs=True, top_logprobs=2,
        stream=True, stream_options={"include_usage": True}))
    *answer, last = chunks
    assert last.choices == [] and all(c.usage is None for c in answer) and answer[-1].choices[0].finish_reason
    content = [e.model_dump() for c in answer if c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    speculation = [s for c in answer for s in c.choices[0].speculation]
    assert len(content) == len(speculation) == last.usage.completion_tokens
    assert joined_bytes(content) == "".join(c.choices[0].delta.content or "" for c in answer)
    assert [e["kind"] for e in content] == [s["kind"] for s in speculation]
    token_ids = [s["token_id"] for s in speculation]
    check_against_target(content, token_ids, target_logprobs(engine, PROMPT, token_ids, temperature=0.7), 2)
    raw = target_logprobs(engine, PROMPT, token_ids)  # the model's own, before temperature: not what is reported
    assert max(abs(e["logprob"] - float(raw[i, t])) for i, (e, t) in enumerate(zip(content, token_ids))) > 10 * TOL

    plain = list(openai_client.chat.completions.create(model=SMOL, messages=PROMPT, temperature=0, max_tokens=2,
                                                       stream=True))
    assert all(c.usage is None and c.choices for c in plain)  # no include_usage: no usage chunk, no usage
    assert all(c.choices[0].logprobs is None for c in plain)  # nor logprobs, not asked for


def test_langchain_chat_openai_gets_logprobs_streamed_and_not(server):
    import langchain_openai

    url, _ = server
    llm = langchain_openai.ChatOpenAI(model=SMOL, base_url=f"{url}v1", api_key=KEY, temperature=0,
                                      max_tokens=N_TOKENS, logprobs=True, top_logprobs=2, stream_usage=True)
    whole = llm.invoke(PROMPT[0]["content"])
    content = whole.response_metadata["logprobs"]["content"]
    assert whole.response_metadata["finish_reason"] == "length"
    assert len(content) == whole.usage_metadata["output_tokens"] and joined_bytes(content) == whole.content
    assert all(e["kind"] in {"accepted", "corrected", "bonus", "plain"} and len(e["top_logprobs"]) == 2
               for e in content)

    streamed = None
    for chunk in llm.stream(PROMPT[0]["content"]):
        streamed = chunk if streamed is None else streamed + chunk
    assert streamed.content == whole.content
    assert streamed.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]  # the usage chunk
    streamed_content = streamed.response_metadata["logprobs"]["content"]
    # The same tokens, bytes and logprobs; not the same kinds: which tokens a draft proposed depends on the
    # adaptive k, which prices drafts on this machine's measured step costs, so two runs may split differently.
    assert [(e["token"], e["bytes"]) for e in streamed_content] == [(e["token"], e["bytes"]) for e in content]
    assert {e["kind"] for e in streamed_content} <= {"accepted", "corrected", "bonus", "plain"}
    assert [e["logprob"] for e in streamed_content] == pytest.approx([e["logprob"] for e in content], abs=TOL)


@pytest.mark.parametrize("kwargs, param", [
    (dict(tools=[{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]), "tools"),
    (dict(tool_choice="auto"), "tool_choice"),
    (dict(response_format={"type": "json_object"}), "response_format"),
    (dict(temperature=2.5), "temperature"),
    (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
])
def test_what_the_server_cannot_honour_is_a_bad_request_naming_the_param(openai_client, kwargs, param):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        openai_client.chat.completions.create(model=SMOL, messages=PROMPT, max_tokens=2, **kwargs)
    error = err.value.response.json()["error"]
    assert error["param"] == param and param in error["message"] and error["type"] == "invalid_request_error"


def test_langchain_tools_are_refused_not_ignored(server):
    import langchain_openai
    import openai

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    llm = langchain_openai.ChatOpenAI(model=SMOL, base_url=f"{server[0]}v1", api_key=KEY, max_tokens=2)
    with pytest.raises(openai.BadRequestError) as err:
        llm.bind_tools([add]).invoke("What is 2 + 3?")
    assert err.value.response.json()["error"]["param"] == "tools"


def test_a_cached_answer_reports_no_logprobs_rather_than_inventing_them(server, openai_client):
    """The same greedy question twice: the first answer (complete, so the cache stores it) has the target's numbers;
    the second is served from the cache (outcome "exact", every token "cached"), which keeps no distribution."""
    messages = [{"role": "user", "content": "Reply with one word: is the sky blue?"}]

    def ask():
        return openai_client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=64,
                                                     logprobs=True, top_logprobs=2)

    first, second = ask(), ask()
    assert first.choices[0].finish_reason == "stop" and first.x_cache["outcome"] == "miss"
    assert all(e.logprob is not None and len(e.top_logprobs) == 2 for e in first.choices[0].logprobs.content)
    assert second.x_cache["outcome"] == "exact" and second.choices[0].message.content == first.choices[0].message.content
    content = [e.model_dump() for e in second.choices[0].logprobs.content]
    assert content and all(e["kind"] == "cached" and e["logprob"] is None and e["top_logprobs"] == [] for e in content)
    assert [e["bytes"] for e in content] == [e.bytes for e in first.choices[0].logprobs.content]
    assert joined_bytes(content) == second.choices[0].message.content


def test_a_prediction_drafts_for_the_openai_client_and_langchain_and_the_answer_stays_the_targets(server,
                                                                                                openai_client):
    """OpenAI's predicted outputs: the answer with and without a prediction is the same text (greedy), and usage's
    completion_tokens_details counts the prediction's tokens the target kept and the ones it replaced. An edited
    prediction (a word changed midway) has both."""
    import langchain_openai

    url, _ = server
    messages = [{"role": "user", "content": "Write a Python function that multiplies two numbers."}]

    def ask(**kw):
        return openai_client.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=24, **kw)

    plain = ask()
    text = plain.choices[0].message.content
    assert plain.choices[0].finish_reason == "length"  # cut by the limit: the cache stores none of these
    words = text.split(" ")
    edited = " ".join(words[: len(words) // 2] + ["banana"] + words[len(words) // 2 + 1:])
    for prediction, rejected in ((text, False), (edited, True)):
        reply = ask(prediction={"type": "content", "content": prediction})
        details = reply.usage.completion_tokens_details
        assert reply.choices[0].message.content == text
        assert details.accepted_prediction_tokens > 0
        assert (details.rejected_prediction_tokens > 0) == rejected
        kinds = [s["kind"] for s in reply.choices[0].speculation]
        assert kinds.count("accepted") >= details.accepted_prediction_tokens

    llm = langchain_openai.ChatOpenAI(model=SMOL, base_url=f"{url}v1", api_key=KEY, temperature=0, max_tokens=24)
    reply = llm.invoke(messages[0]["content"], prediction={"type": "content", "content": text})
    assert reply.content == text
    assert reply.response_metadata["token_usage"]["completion_tokens_details"]["accepted_prediction_tokens"] > 0
