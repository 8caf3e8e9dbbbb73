"""The naive target-only decoder: one forward per token. Everything else is compared against it.

It reuses a runner by the same rule as the loop (``Runner.resume``) and tracks the same position ``pos``:
the tokens the target's cache holds.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.config import SamplingConfig
from engine.events import Event
from engine.decode.clock import StepClock
from engine.decode.draft import EMPTY_DRAFT
from engine.backends.contract import Runner
from engine.decode.sampling import logits_to_probs, make_generator, sample, top_tokens
from engine.decode.stream import StatsTracker, TokenStream


def reference_generate(target: Runner, prompt_ids: list[int], stream: TokenStream, sampling: SamplingConfig,
                       cancel: threading.Event | None = None, narrow: int | None = None) -> Iterator[Event]:
    """Target-only decoding, one token per forward after the prompt's prefill. ``narrow`` (the widest forward whose
    rows equal rows fed alone, where the identity check found one): the prompt's rows are computed as a fresh
    prefill computes them, whatever the runner held (``Runner.resume``)."""
    generator = make_generator(sampling.seed, target.logits_device)
    stats = StatsTracker(proposer="target-only")
    context = list(prompt_ids)
    pos = target.resume(context, narrow=narrow)
    while not stream.finished(cancel):
        clock = StepClock(target)
        fed = context[pos:]
        p_target = logits_to_probs(target.forward(fed, n_logits=1)[-1], sampling)  # (vocab,)
        token = sample(p_target, sampling, generator)
        stats.record_step(clock.step(EMPTY_DRAFT, 0, len(fed)))
        pos = len(context)
        context.append(token)
        top = top_tokens(p_target[None], sampling.candidates or 0)[0]
        event = stream.emit(token, "plain", stats.acceptance.steps - 1, top, p_target=float(p_target[token]))
        if event is not None:
            yield event
        yield stats.snapshot(len(stream.token_ids))
    yield stream.done(stats.snapshot(len(stream.token_ids)))
