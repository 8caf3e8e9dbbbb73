"""The naive target-only decoder: one forward per token. Everything else is compared against it."""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

from engine.config import SamplingConfig
from engine.events import Event
from engine.decode.runner import ModelRunner, synchronize
from engine.decode.sampling import logits_to_probs, make_generator, sample
from engine.decode.stream import StatsTracker, TokenStream


def reference_generate(target: ModelRunner, prompt_ids: list[int], stream: TokenStream, sampling: SamplingConfig,
                       cancel: threading.Event | None = None) -> Iterator[Event]:
    generator = make_generator(sampling.seed, target.device)
    stats = StatsTracker(proposer="target-only")
    context = list(prompt_ids)
    while not stream.finished(cancel):
        synchronize(target.device)
        t = time.perf_counter()
        p_target = logits_to_probs(target.forward(context[len(target.tokens):], n_logits=1)[-1], sampling)  # (vocab,)
        token = sample(p_target, sampling, generator)
        synchronize(target.device)
        stats.verify_s += time.perf_counter() - t
        stats.record_step(0, 0)
        context.append(token)
        event = stream.emit(token, "target", stats.steps - 1, p_target=float(p_target[token]))
        if event is not None:
            yield event
        yield stats.snapshot(len(stream.token_ids))
    yield stream.done(stats.snapshot(len(stream.token_ids)))
