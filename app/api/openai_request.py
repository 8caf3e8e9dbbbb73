"""What /v1/chat/completions reads: the request model, what this server refuses, and the engine's settings a request
becomes.

What the server cannot honour is refused with OpenAI's 400 and the parameter named, never silently ignored: tools
and function calls, a ``response_format`` other than text, more than one choice, a temperature outside OpenAI's
[0, 2], non-zero penalties and a logit bias. An engine setting the engine refuses (engine/config.py) is a 400
that names the request's parameter too.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from app.api.openai_format import ApiError
from engine.config import DEFAULT_SAMPLING, MAX_STOPS, SamplingConfig
from engine.errors import InvalidSettingError

OPENAI_TEMPERATURE = 1.0  # OpenAI's default when a request names none (every other default is the engine's)
OPENAI_MAX_TEMPERATURE = 2.0  # OpenAI's range is [0, 2]; the engine's own goes further (the UI's slider)
# the request's parameter behind each engine setting it sets (max_new_tokens: max_tokens or max_completion_tokens)
PARAM_OF_SETTING = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "candidates": "top_logprobs",
                    "stop": "stop"}


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool | None = None


class ChatCompletionRequest(BaseModel):
    """What /v1/chat/completions reads. The fields after ``stream_options`` are read only to be refused; OpenAI
    fields not named here (metadata, …) are accepted and ignored."""
    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[ChatMessage]
    temperature: float | None = None  # None: OPENAI_TEMPERATURE
    top_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    n: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    stream_options: StreamOptions | None = None
    prediction: dict | None = None  # {"type": "content", "content": text or text parts}: a free draft (prediction_text)
    user: str | None = None  # OpenAI's end-user id: that user's earlier answers draft theirs (memory_scope)
    tools: list | None = None
    functions: list | None = None
    tool_choice: str | dict | None = None
    function_call: str | dict | None = None
    response_format: dict | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict | None = None


def refused(param: str, message: str, code: str = "unsupported_parameter") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def check_request(req: ChatCompletionRequest) -> None:
    """Refuse, with the parameter named, what this server would otherwise have to ignore or get wrong."""
    for param in ("tools", "functions"):
        if getattr(req, param):
            raise refused(param, f"{param} are not supported: this server makes no tool or function calls (its "
                                 "models answer in plain text)")
    for param in ("tool_choice", "function_call"):
        if getattr(req, param) not in (None, "none"):
            raise refused(param, f"{param} {getattr(req, param)!r} is not supported: this server makes no tool or "
                                 'function calls; leave it out or send "none"', "unsupported_value")
    if req.response_format not in (None, {"type": "text"}):
        raise refused("response_format", f"response_format {req.response_format!r} is not supported: answers are "
                                         'plain text; leave it out or send {"type": "text"}', "unsupported_value")
    if req.temperature is not None and not 0 <= req.temperature <= OPENAI_MAX_TEMPERATURE:
        raise refused("temperature", f"temperature must be in [0, {OPENAI_MAX_TEMPERATURE:g}] (OpenAI's range), got "
                                     f"{req.temperature!r}", "invalid_value")
    if req.top_logprobs is not None and not req.logprobs:
        raise refused("top_logprobs", "top_logprobs needs logprobs: true", "invalid_value")
    if req.stream_options is not None and not req.stream:
        raise refused("stream_options", "stream_options is only allowed with stream: true", "invalid_value")
    for param in ("frequency_penalty", "presence_penalty", "logit_bias"):  # each would change the answer
        if getattr(req, param):
            raise refused(param, f"{param} is not supported: the answer is the target's own distribution (the "
                                 "identity speculation keeps); leave it out or send 0", "unsupported_value")
    if req.n not in (None, 1):
        raise refused("n", f"only n=1 is supported, got {req.n}", "unsupported_value")


def _text(content: str | list[dict] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise refused("messages", f"only text content parts are supported, got type {kind!r}",
                          "unsupported_value")
        parts.append(part["text"])
    return "".join(parts)


def memory_scope(req: ChatCompletionRequest) -> str:
    """Whose earlier prompts and answers draft this request (engine/proposers/memory.py): the request's ``user``,
    else the instance's own (the chat's too: one API key, one person or team)."""
    return f"user:{req.user}" if req.user else ""


def prediction_text(req: ChatCompletionRequest) -> str:
    """The text of OpenAI's predicted output (``prediction``), "" without one: the answer is expected to restate
    it, and the target verifies it as a free draft (engine/proposers/prediction.py)."""
    if req.prediction is None:
        return ""
    if req.prediction.get("type") != "content" or "content" not in req.prediction:
        raise refused("prediction", 'prediction must be {"type": "content", "content": "..."} (OpenAI\'s predicted '
                                    f"outputs), got {req.prediction!r:.120}", "invalid_value")
    content = req.prediction["content"]
    if not isinstance(content, (str, list)):
        raise refused("prediction", "prediction.content must be a string or a list of text parts", "invalid_value")
    try:
        return _text(content)
    except ApiError as err:
        raise refused("prediction", err.message.replace("content parts", "prediction parts"), err.code) from None


def engine_messages(req: ChatCompletionRequest) -> list[dict]:
    """OpenAI messages -> the engine's [{"role", "content"}] ("developer" counts as "system")."""
    return [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
            for m in req.messages]


def stop_strings(req: ChatCompletionRequest) -> tuple[str, ...]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS:
        raise refused("stop", f"at most {MAX_STOPS} stop strings, got {len(stops)}", "invalid_value")
    return tuple(s for s in stops if s)


def _first_given(*values):
    return next((v for v in values if v is not None), None)


def sampling_of(req: ChatCompletionRequest) -> SamplingConfig:
    """The request's sampling; what it leaves out is OpenAI's default temperature, else the engine's defaults.
    A given ``max_tokens`` of 0 is passed on, for the engine to refuse (as OpenAI does), not taken as unset.
    ``logprobs`` asks the engine for each token's candidates: ``top_logprobs`` of them (0 when not given). The stop
    strings go to the engine, which stops decoding at one (the response's Release cuts the text there)."""
    max_new_tokens = _first_given(req.max_completion_tokens, req.max_tokens, DEFAULT_SAMPLING.max_new_tokens)
    try:
        return SamplingConfig(temperature=OPENAI_TEMPERATURE if req.temperature is None else req.temperature,
                              top_p=DEFAULT_SAMPLING.top_p if req.top_p is None else req.top_p,
                              max_new_tokens=max_new_tokens, seed=req.seed,
                              candidates=(req.top_logprobs or 0) if req.logprobs else None, stop=stop_strings(req))
    except InvalidSettingError as err:
        param = ("max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens") \
            if err.setting == "max_new_tokens" else PARAM_OF_SETTING.get(err.setting)
        named = "" if param in (None, err.setting) else f" (the request's {param})"
        raise ApiError(400, f"{err}{named}", param=param, code="invalid_value") from err
