"""A plain API endpoint for gradio_client: ``Client(url).predict("Hello", api_name="/chat")``."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing
from dataclasses import replace

from app import toast
from app.context import AppContext
from app.turn import Turn
from engine.config import CACHE_OFF, DEFAULT_CACHE, DEFAULT_SAMPLING, DEFAULT_SPEC, SamplingConfig
from engine.errors import EngineError


def _result(turn: Turn) -> dict:
    return {"text": turn.text, "finish_reason": turn.finish_reason, "kinds": turn.kind_counts(),
            "cache": turn.cache.to_dict() if turn.cache else None,
            "stats": turn.stats.to_dict() if turn.stats else None}


def make_chat_api(ctx: AppContext):
    def chat(message: str, history: list[dict] | None = None, k: int = DEFAULT_SPEC.k,
             max_new_tokens: int = DEFAULT_SAMPLING.max_new_tokens, temperature: float = DEFAULT_SAMPLING.temperature,
             seed: int | None = None, cache: bool = True) -> Iterator[dict]:
        """Answer `message` (after the optional `history` of {"role", "content"} messages) with speculative
        decoding, as the app does by default (proposer, adaptive k, semantic cache). Streams the answer so far
        after every step; the last value has the answer text, why it finished, the count of each token kind,
        the cache outcome and the final statistics. Cancelling the job stops the generation at its next step."""
        turn, cancel = Turn(), threading.Event()
        try:
            sampling = SamplingConfig(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
            messages = [*(history or []), {"role": "user", "content": message}]
            events = ctx.engine.generate(messages, sampling, replace(DEFAULT_SPEC, k=k),
                                         cache=DEFAULT_CACHE if cache else CACHE_OFF, cancel=cancel)
            with closing(events):
                for event in events:
                    turn.add(event)
                    if event.type != "token":
                        yield _result(turn)
        except EngineError as err:
            raise toast.error(str(err)) from err
        finally:  # a cancelled job or a gone client closes this generator: stop the engine too
            cancel.set()

    return chat
