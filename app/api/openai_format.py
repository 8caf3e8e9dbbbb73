"""The OpenAI chat-completions wire format: answers as released to the client, response and chunk bodies, errors.

Pure functions and small classes; app/api/openai_routes.py wires them to the engine (the request side is
app/api/openai_request.py). Extensions beyond OpenAI's format: ``choices[0].speculation`` (one entry per token:
kind, text, p_target, q_draft, token_id), a ``kind`` in each logprobs entry, the acceptance numbers in ``usage``
and the cache outcome in ``x_cache``.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass, field

from engine.events import DoneEvent

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "stop"}


class ApiError(Exception):
    """A request refused with OpenAI's error body (``error_body``), its HTTP status and the parameter at fault."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None,
                 headers: dict | None = None, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code, self.headers = status, message, kind, code, headers
        self.param = param


def speculation_entry(ev, text: str | None = None) -> dict:
    return {"kind": ev.kind, "text": ev.text if text is None else text, "token_id": ev.token_id,
            "p_target": ev.p_target, "q_draft": ev.q_draft}


def _logprob(p: float | None) -> float | None:
    """ln p; None where there is no distribution (a cached token). p is never 0 here: the engine leaves such
    tokens out, and JSON has no -inf."""
    return math.log(p) if p else None


def _spelled(candidate) -> dict:
    return {"token": candidate.text, "logprob": _logprob(candidate.p_target), "bytes": list(candidate.utf8)}


def logprob_entry(ev) -> dict:
    """OpenAI's ``logprobs.content`` entry of one token, from the target's distribution at its position (the
    engine's Candidates), with the token's speculation ``kind`` beside it. A cached token has no distribution:
    ``logprob`` null and no ``top_logprobs``."""
    candidates = ev.candidates
    if candidates is None:  # an engine that was not asked, or could not say: the text alone, no numbers
        return {"token": ev.text, "logprob": None, "bytes": list(ev.text.encode()), "top_logprobs": [],
                "kind": ev.kind}
    return {**_spelled(candidates.chosen), "top_logprobs": [_spelled(c) for c in candidates.top], "kind": ev.kind}


@dataclass(frozen=True)
class Piece:
    """What one event releases to the client: text, and the tokens it completes as speculation entries and, when
    the request asked for logprobs, as logprobs entries (else None)."""
    text: str = ""
    speculation: list[dict] = field(default_factory=list)
    logprobs: list[dict] | None = None


def joined(pieces: list[Piece]) -> Piece:
    """Pieces one after the other, as one (the whole answer's)."""
    logprobs = [e for p in pieces for e in p.logprobs or []] if any(p.logprobs is not None for p in pieces) else None
    return Piece("".join(p.text for p in pieces), [e for p in pieces for e in p.speculation], logprobs)


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
    """One generation's events as the client receives them, fed one at a time: the Piece each event releases
    (``Release`` holds text back near a stop string and cuts at one), the cache outcome, and from the last event
    the finish reason and usage. The whole and the streamed response are both made from it, so they cannot
    disagree. ``logprobs``: the request asked for them."""
    release: Release
    logprobs: bool = False
    cache: dict | None = None
    done: DoneEvent | None = None  # the last event, once it came
    n_tokens: int = 0  # tokens released so far (a cut token counts; the tokens after it never do)

    def add(self, event) -> Piece:
        """What ``event`` releases (nothing once a stop string has cut)."""
        if event.type == "token":
            return self._piece(self.release.add(event))
        if event.type == "cache":
            self.cache = event.to_dict()
        elif event.type == "done":
            self.done = event
        return Piece()

    def finish(self) -> Piece:
        """What is still held back, released at the end."""
        return self._piece(self.release.finish())

    @property
    def stopped(self) -> bool:
        """A stop string was found (the engine stopped in the step that made it: SamplingConfig.stop)."""
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

    def _piece(self, released: tuple[str, list[dict]]) -> Piece:
        """The released text and speculation entries, with the logprobs entries of the same tokens (the Release
        keeps every token it was fed; the first ``n_tokens`` of them have been released before)."""
        delta, speculation = released
        tokens = self.release.tokens[self.n_tokens: self.n_tokens + len(speculation)]
        self.n_tokens += len(speculation)
        return Piece(delta, speculation, [logprob_entry(ev) for ev in tokens] if self.logprobs else None)


def usage(prompt_tokens: int, completion_tokens: int, stats) -> dict:
    """OpenAI's usage, with its ``completion_tokens_details``: ``accepted_prediction_tokens`` are the prediction's
    tokens the target verified and kept, ``rejected_prediction_tokens`` those it verified and replaced (a span the
    k policy cut was never computed, so it counts in neither). Then the acceptance of every draft, this server's."""
    proposed, accepted = (stats.acceptance.proposed, stats.acceptance.accepted) if stats is not None else (0, 0)
    predicted = stats.of_source("prediction") if stats is not None else None
    kept = predicted.accepted if predicted else 0
    details = {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": kept,
               "rejected_prediction_tokens": (predicted.proposed - kept) if predicted else 0}
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "completion_tokens_details": details,
            "proposed": proposed, "accepted": accepted, "acceptance_rate": accepted / proposed if proposed else 0.0}


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def _choice_logprobs(entries: list[dict] | None) -> dict | None:
    return None if entries is None else {"content": entries, "refusal": None}


def completion_body(cid: str, model: str, text: str, finish_reason: str, released: Piece, use: dict,
                    cache: dict | None, x_identity: dict | None = None) -> dict:
    """The whole answer (``released``: all its tokens' entries); ``x_identity``: the pair's load-time check."""
    return {"id": cid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason, "logprobs": _choice_logprobs(released.logprobs),
                         "speculation": released.speculation}],
            "usage": use, "x_cache": cache, "x_identity": x_identity}


def chunk_body(cid: str, model: str, delta: dict, released: Piece | None = None, finish_reason: str | None = None,
               cache: dict | None = None, null_usage: bool = False, x_identity: dict | None = None) -> dict:
    """One chat.completion.chunk with one choice; a chunk that releases no tokens has ``logprobs`` null. With
    ``null_usage`` (the request's include_usage) it has ``usage`` null: only the last chunk (``usage_chunk``) has it."""
    released = released or Piece()
    choice = {"index": 0, "delta": delta, "finish_reason": finish_reason,
              "logprobs": _choice_logprobs(released.logprobs or None), "speculation": released.speculation}
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [choice]}
    if null_usage:
        body["usage"] = None
    if cache is not None:
        body["x_cache"] = cache
    if x_identity is not None:
        body["x_identity"] = x_identity
    return body


def usage_chunk(cid: str, model: str, use: dict) -> dict:
    """``stream_options.include_usage``'s last chunk, before ``[DONE]``: no choices, the usage of the request."""
    return {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [], "usage": use}


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
