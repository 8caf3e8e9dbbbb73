"""The draft–verify loop. Read top to bottom: propose, verify, accept, roll back, emit.

``speculative_generate`` is lossless: with greedy sampling it returns exactly the tokens of
``engine.decode.reference.reference_generate``; with sampling, the same distribution (rejection sampling).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

from engine.config import SamplingConfig
from engine.events import Event, TokenEvent
from engine.decode.kpolicy import KPolicy
from engine.decode.clock import StepClock
from engine.backends.contract import Runner
from engine.decode.draft import Draft, Proposer
from engine.decode.sampling import logits_to_probs, make_generator, top_tokens
from engine.decode.stream import StatsTracker, TokenStream
from engine.decode.verify import Verdict, verify_greedy, verify_rejection


def speculative_generate(target: Runner, proposer: Proposer, prompt_ids: list[int], stream: TokenStream,
                         sampling: SamplingConfig, k_policy: KPolicy, *, cancel: threading.Event | None = None,
                         narrow: int | None = None) -> Iterator[Event]:
    """Yield TokenEvents as they are decided, a StatsEvent after each step, and a final DoneEvent. ``k_policy``
    says once per step what the step may draft (its ``StepBudget``: every cap on a step, the verify width of the
    identical mode among them). ``narrow``: the prompt's rows are computed as a fresh prefill computes them
    (``Runner.resume``), where verifies wider than that round differently."""
    generator = make_generator(sampling.seed, target.logits_device)
    proposer.reset(prompt_ids, sampling, generator)
    stats = StatsTracker(proposer=proposer.name)
    context = list(prompt_ids)
    pos = target.resume(context, narrow=narrow)  # what the target's cache holds of it (gpt-fast's input_pos)
    while not stream.finished(cancel):
        clock = StepClock(target)
        # 0. the step's budget: what it may draft, and why
        budget = k_policy.budget(stream.remaining, unseen=len(context) - pos, behind=proposer.behind(context))
        # 1. propose, within the budget (a free draft cut at a turn marker, then to what its evidence pays)
        offered = proposer.propose(context, budget).before(stream.special_ids)
        draft, cut = budget.keep(offered)
        clock.lap()
        # 2. verify: one target forward over [tokens the target has not seen, *draft]
        fed = context[pos:] + draft.tokens
        p_target = logits_to_probs(target.forward(fed, n_logits=len(draft) + 1), sampling)  # (k+1, vocab)
        # 3. accept
        verdict = _verify(p_target, draft, sampling, generator)
        step = clock.step(draft, verdict.n_accepted, len(fed), offered, verdict.token)
        k_policy.update(step)
        stats.record_step(step, budget, k_policy.costs, cut)
        # 4. roll back the target to the accepted prefix (the new token is fed next step)
        pos = len(context) + verdict.n_accepted
        target.rollback(pos)
        # 5. emit (with the most likely tokens of each emitted position, when the sampling asks for them)
        context += draft.tokens[: verdict.n_accepted] + [verdict.token]
        tops = top_tokens(p_target[: verdict.n_accepted + 1], sampling.candidates or 0)
        yield from _emit(stream, draft, verdict, p_target, tops, stats.acceptance.steps - 1)
        yield stats.snapshot(len(stream.token_ids))
    yield stream.done(stats.snapshot(len(stream.token_ids)))


def _verify(p_target: torch.Tensor, draft: Draft, sampling: SamplingConfig, generator: torch.Generator) -> Verdict:
    if sampling.greedy:
        return verify_greedy(p_target, draft.tokens)
    return verify_rejection(p_target, draft.tokens, draft.q_probs, generator)


def _emit(stream: TokenStream, draft: Draft, verdict: Verdict, p_target: torch.Tensor,
          tops: list[list[tuple[int, float]]], step: int) -> Iterator[TokenEvent]:
    """TokenEvents for the accepted draft tokens and the target's own token, with their p and q; ``tops[i]``: the
    most likely tokens of row i of p_target."""
    n = verdict.n_accepted
    q = draft.q_probs
    for i, token in enumerate(draft.tokens[:n]):
        event = stream.emit(token, "accepted", step, tops[i], p_target=float(p_target[i, token]),
                            q_draft=float(q[i, token]) if q is not None else None, draft_pos=i)
        if event is not None:
            yield event
    token = verdict.token
    if len(draft) == 0:
        kind, info = "plain", {}
    elif verdict.kind == "corrected":
        kind = "corrected"
        info = {"draft_pos": n, "rejected_token_id": draft.tokens[n],
                "q_draft": float(q[n, token]) if q is not None else None}
    else:
        kind, info = "bonus", {}
    event = stream.emit(token, kind, step, tops[n], p_target=float(p_target[n, token]), **info)
    if event is not None:
        yield event
