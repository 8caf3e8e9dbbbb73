"""The OpenAI chat-completions wire format: request model, stop strings, response and chunk bodies, errors.

Pure functions and small classes; app/api/openai_routes.py wires them to the engine. Extensions beyond OpenAI's
format: ``choices[0].speculation`` (one entry per token: kind, text, p_target, q_draft, token_id), the
acceptance numbers in ``usage`` and the cache outcome in ``x_cache``.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict

from engine.errors import InvalidSettingError
from engine.events import DoneEvent

FINISH = {"eos": "stop", "length": "length", "cancelled": "stop"}
OPENAI_TEMPERATURE = 1.0  # OpenAI's default when a request names none (every other default is the engine's)
MAX_STOPS = 4


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[dict] | None = None


class ChatCompletionRequest(BaseModel):
    """What /v1/chat/completions reads; other OpenAI fields are accepted and ignored."""
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


def _text(content: str | list[dict] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise InvalidSettingError(f"only text content parts are supported, got type {part.get('type')!r}")
        parts.append(part["text"])
    return "".join(parts)


def engine_messages(req: ChatCompletionRequest) -> list[dict]:
    """OpenAI messages -> the engine's [{"role", "content"}] ("developer" counts as "system")."""
    if req.n not in (None, 1):
        raise InvalidSettingError("only n=1 is supported")
    return [{"role": "system" if m.role == "developer" else m.role, "content": _text(m.content)}
            for m in req.messages]


def stop_strings(req: ChatCompletionRequest) -> tuple[str, ...]:
    stops = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    if len(stops) > MAX_STOPS:
        raise InvalidSettingError(f"at most {MAX_STOPS} stop strings, got {len(stops)}")
    return tuple(s for s in stops if s)


def speculation_entry(ev, text: str | None = None) -> dict:
    return {"kind": ev.kind, "text": ev.text if text is None else text, "token_id": ev.token_id,
            "p_target": ev.p_target, "q_draft": ev.q_draft}


@dataclass
class Release:
    """Answer text released to the client: held back while it could still become a stop string, cut at one.

    ``add`` takes each TokenEvent and returns the newly releasable text and the tokens now fully released."""
    stops: tuple[str, ...] = ()
    text: str = ""
    sent: int = 0
    cut: int | None = None  # where the first stop string begins
    starts: list[int] = field(default_factory=list)
    tokens: list = field(default_factory=list)
    n_released: int = 0

    def add(self, ev) -> tuple[str, list[dict]]:
        if self.cut is not None:
            return "", []
        self.starts.append(len(self.text))
        self.tokens.append(ev)
        self.text += ev.text
        hits = [i for i in (self.text.find(s, self.sent) for s in self.stops) if i >= 0]
        if hits:
            self.cut = min(hits)
            return self._release(self.cut, final=True)
        return self._release(len(self.text) - self._holdback(), final=False)

    def finish(self) -> tuple[str, list[dict]]:
        return self._release(len(self.text) if self.cut is None else self.cut, final=True)

    @property
    def released_text(self) -> str:
        return self.text[: self.sent]

    def _holdback(self) -> int:
        """Length of the longest end of the text that begins some stop string."""
        return max((k for s in self.stops for k in range(min(len(s) - 1, len(self.text)), 0, -1)
                    if self.text.endswith(s[:k])), default=0)

    def _release(self, upto: int, final: bool) -> tuple[str, list[dict]]:
        delta = self.text[self.sent: upto] if upto > self.sent else ""
        self.sent = max(self.sent, upto)
        entries = []
        while self.n_released < len(self.tokens):
            start, ev = self.starts[self.n_released], self.tokens[self.n_released]
            end = start + len(ev.text)
            if self.cut is not None:
                if start >= self.cut and (ev.text or start > self.cut or not final):
                    break
                entries.append(speculation_entry(ev, ev.text[: self.cut - start]))
            elif final or end <= upto:
                entries.append(speculation_entry(ev))
            else:
                break
            self.n_released += 1
        return delta, entries


@dataclass
class Answer:
    """One generation's events as the client receives them, fed one at a time: the text and speculation entries
    each event releases (``Release`` holds them back near a stop string and cuts at one), the cache outcome,
    and from the last event the finish reason and usage. The whole and the streamed response are both made
    from it, so they cannot disagree."""
    release: Release
    cache: dict | None = None
    done: DoneEvent | None = None  # the last event, once it came
    n_tokens: int = 0  # tokens released so far (a cut token counts; the tokens after it never do)

    def add(self, event) -> tuple[str, list[dict]]:
        """The text and speculation entries that ``event`` releases (nothing once a stop string has cut)."""
        if event.type == "token":
            return self._count(self.release.add(event))
        if event.type == "cache":
            self.cache = event.to_dict()
        elif event.type == "done":
            self.done = event
        return "", []

    def finish(self) -> tuple[str, list[dict]]:
        """What is still held back, released at the end."""
        return self._count(self.release.finish())

    @property
    def stopped(self) -> bool:
        """A stop string was found: the engine should stop at its next step."""
        return self.release.cut is not None

    @property
    def text(self) -> str:
        return self.release.released_text

    def finish_reason(self) -> str:
        if self.stopped or self.done is None:
            return "stop"
        return FINISH.get(self.done.finish_reason, "stop")

    def usage(self) -> dict:
        if self.done is None:  # the generation failed mid-stream
            return usage(0, self.n_tokens, None)
        return usage(self.done.prompt_tokens, self.n_tokens, self.done.stats)

    def _count(self, released: tuple[str, list[dict]]) -> tuple[str, list[dict]]:
        self.n_tokens += len(released[1])
        return released


def usage(prompt_tokens: int, completion_tokens: int, stats) -> dict:
    proposed = getattr(stats, "proposed", 0) if stats is not None else 0
    accepted = getattr(stats, "accepted", 0) if stats is not None else 0
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "proposed": proposed, "accepted": accepted,
            "acceptance_rate": accepted / proposed if proposed else 0.0}


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion_body(cid: str, model: str, text: str, finish_reason: str, speculation: list[dict], use: dict,
                    cache: dict | None) -> dict:
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason, "logprobs": None, "speculation": speculation}],
            "usage": use, "x_cache": cache}


def chunk_body(cid: str, model: str, delta: dict, speculation: list[dict] | None = None,
               finish_reason: str | None = None, use: dict | None = None, cache: dict | None = None) -> dict:
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None,
              "speculation": speculation or []}
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [choice]}
    if use is not None:
        body["usage"] = use
    if cache is not None:
        body["x_cache"] = cache
    return body


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def validation_error_body(errors: list[dict]) -> dict:
    """pydantic's errors -> one OpenAI-style error naming the first bad field."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", ()) if x != "body"]
    param = ".".join(loc) or None
    message = f"{param}: {first.get('msg', 'invalid request')}" if param else first.get("msg", "invalid request")
    return error_body(message, param=param, code=first.get("type"))
