"""A plain API endpoint for gradio_client: ``Client(url).predict("Hello", api_name="/chat")``."""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import closing

from app import toast
from app.context import AppContext
from app.settings import UISettings, cache_config, sampling_config, spec_config
from app.turn import Turn
from engine.errors import EngineError


def _result(turn: Turn) -> dict:
    return {"text": turn.text, "finish_reason": turn.finish_reason, "kinds": turn.kind_counts(),
            "cache": turn.cache.to_dict() if turn.cache else None,
            "stats": turn.stats.to_dict() if turn.stats else None}


def make_chat_api(ctx: AppContext):
    def chat(message: str, history: list[dict] | None = None, k: int = 4, max_new_tokens: int = 128,
             temperature: float = 0.0, seed: int | None = None, cache: bool = True) -> Iterator[dict]:
        """Answer `message` (after the optional `history` of {"role", "content"} messages) with speculative
        decoding. Streams the answer so far after every step; the last value has the answer text, why it
        finished, the count of each token kind, the cache outcome and the final statistics.
        Cancelling the job stops the generation at its next step."""
        s = UISettings(k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                       cache_enabled=cache)
        turn, cancel = Turn(), threading.Event()
        try:
            messages = [*(history or []), {"role": "user", "content": message}]
            events = ctx.engine.generate(messages, sampling_config(s), spec_config(s), cache=cache_config(s),
                                         cancel=cancel)
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
