"""A plain API endpoint for gradio_client: ``Client(url).predict("Hello", api_name="/chat")``."""
from __future__ import annotations

import gradio as gr

from app.context import AppContext
from app.settings import UISettings, cache_options, sampling_config, spec_config
from app.turn import Turn
from engine.errors import EngineError


def make_chat_api(ctx: AppContext):
    def chat(message: str, history: list[dict] | None = None, k: int = 4, max_new_tokens: int = 128,
             temperature: float = 0.0, seed: int | None = None, cache: bool = True) -> dict:
        """Answer `message` (after the optional `history` of {"role", "content"} messages) with speculative
        decoding. Returns the answer text, why it finished, the count of each token kind, the cache outcome
        and the final statistics."""
        s = UISettings(k=k, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                       cache_enabled=cache)
        turn = Turn()
        try:
            messages = [*(history or []), {"role": "user", "content": message}]
            for event in ctx.engine.generate(messages, sampling_config(s), spec_config(s),
                                             **cache_options(ctx.engine, s)):
                turn.add(event)
        except EngineError as err:
            raise gr.Error(str(err)) from err
        return {"text": turn.text, "finish_reason": turn.finish_reason, "kinds": turn.kind_counts(),
                "cache": turn.cache.to_dict() if turn.cache else None,
                "stats": turn.stats.to_dict() if turn.stats else None}

    return chat
