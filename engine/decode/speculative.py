"""The draft–verify loop. Read top to bottom: propose, verify, accept, roll back, emit.

``speculative_generate`` is lossless: with greedy sampling it returns exactly the tokens of
``engine.decode.reference.reference_generate``; with sampling, the same distribution (rejection sampling).
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import torch

from engine.config import SamplingConfig
from engine.events import Event, TokenEvent
from engine.speed.kpolicy import FixedK, KPolicy
from engine.decode.runner import ModelRunner, synchronize
from engine.decode.draft import Draft, Proposer
from engine.decode.sampling import logits_to_probs, make_generator
from engine.decode.stream import StatsTracker, TokenStream
from engine.decode.verify import Verdict, verify_greedy, verify_rejection


def speculative_generate(target: ModelRunner, proposer: Proposer, prompt_ids: list[int], stream: TokenStream,
                         sampling: SamplingConfig, *, k_policy: KPolicy | None = None,
                         cancel: threading.Event | None = None) -> Iterator[Event]:
    """Yield TokenEvents as they are decided, a StatsEvent after each step, and a final DoneEvent."""
    k_policy = k_policy or FixedK(4)
    generator = make_generator(sampling.seed, target.device)
    proposer.reset(prompt_ids, sampling, generator)
    stats = StatsTracker(proposer=proposer.name)
    context = list(prompt_ids)
    # pos: how many context tokens the target's cache holds (gpt-fast's input_pos). A runner reused from an
    # earlier generation keeps what still fits the prompt; from then on the cache holds context[:pos].
    pos = target.reusable_prefix(context)
    target.rollback(pos)
    while not stream.finished(cancel):
        budget = stream.remaining - 1  # draft tokens beyond this could never be emitted
        # 1. propose (k = 0 asks only for free drafts, e.g. a prompt lookup; a model proposer returns none)
        synchronize(target.device)  # every clock read waits for the device's queued work
        t0 = time.perf_counter()
        choice = k_policy.choose()
        draft = proposer.propose(context, min(choice.k, budget))
        free = draft.q_probs is None  # one-hot drafts cost nothing to make, but widen the verify forward
        limit = k_policy.free_limit() if free else None
        draft = draft.truncate(budget if limit is None else min(budget, limit))
        synchronize(target.device)
        t1 = time.perf_counter()
        # 2. verify: one target forward over [tokens the target has not seen, *draft]
        feed = context[pos:]
        logits = target.forward(feed + draft.tokens, n_logits=len(draft) + 1)  # (k+1, vocab)
        p_target = logits_to_probs(logits, sampling)
        # 3. accept
        verdict = _verify(p_target, draft, sampling, generator)
        synchronize(target.device)
        t2 = time.perf_counter()
        # 4. roll back the target to the accepted prefix (the new token is fed next step)
        pos = len(context) + verdict.n_accepted
        target.rollback(pos)
        model_draft, free_draft = (0, len(draft)) if free else (len(draft), 0)
        k_policy.update(verdict.n_accepted, model_draft, t1 - t0, t2 - t1, n_fed=len(feed) + len(draft),
                        n_free=free_draft)
        stats.draft_s += t1 - t0
        stats.verify_s += t2 - t1
        stats.fallback = choice.fallback
        stats.costs = k_policy.costs
        stats.record_step(len(draft), verdict.n_accepted)
        # 5. emit
        new_tokens = draft.tokens[: verdict.n_accepted] + [verdict.token]
        context += new_tokens
        yield from _emit(stream, draft, verdict, p_target, stats.steps - 1)
        yield stats.snapshot(len(stream.token_ids))
    yield stream.done(stats.snapshot(len(stream.token_ids)))


def _verify(p_target: torch.Tensor, draft: Draft, sampling: SamplingConfig, generator: torch.Generator) -> Verdict:
    if sampling.greedy:
        return verify_greedy(p_target, draft.tokens)
    return verify_rejection(p_target, draft.tokens, draft.q_probs, generator)


def _emit(stream: TokenStream, draft: Draft, verdict: Verdict, p_target: torch.Tensor,
          step: int) -> Iterator[TokenEvent]:
    """TokenEvents for the accepted draft tokens and the target's own token, with their p and q."""
    n = verdict.n_accepted
    q = draft.q_probs
    for i, token in enumerate(draft.tokens[:n]):
        event = stream.emit(token, "accepted", step, p_target=float(p_target[i, token]),
                            q_draft=float(q[i, token]) if q is not None else None, draft_pos=i)
        if event is not None:
            yield event
    token = verdict.token
    if len(draft) == 0:
        kind, info = "target", {}
    elif verdict.kind == "corrected":
        kind = "corrected"
        info = {"draft_pos": n, "rejected_token_id": draft.tokens[n],
                "q_draft": float(q[n, token]) if q is not None else None}
    else:
        kind, info = "bonus", {}
    event = stream.emit(token, kind, step, p_target=float(p_target[n, token]), **info)
    if event is not None:
        yield event
