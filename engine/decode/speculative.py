"""The draft–verify loop. Read top to bottom: propose, verify, accept, roll back, emit.

``speculative_generate`` is lossless: with greedy sampling it returns exactly the tokens of
``engine.decode.reference.reference_generate``; with sampling, the same distribution (rejection sampling).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator

import torch

from engine.config import SamplingConfig
from engine.events import DraftCut, Event, TokenEvent
from engine.costs.kpolicy import FixedK, KChoice, KPolicy, StepRecord
from engine.decode.clock import StepClock
from engine.backends.contract import Runner
from engine.decode.draft import Draft, Proposer
from engine.decode.sampling import logits_to_probs, make_generator, top_tokens
from engine.decode.stream import StatsTracker, TokenStream
from engine.decode.verify import Verdict, verify_greedy, verify_rejection


def speculative_generate(target: Runner, proposer: Proposer, prompt_ids: list[int], stream: TokenStream,
                         sampling: SamplingConfig, *, k_policy: KPolicy | None = None,
                         cancel: threading.Event | None = None, max_width: int | None = None) -> Iterator[Event]:
    """Yield TokenEvents as they are decided, a StatsEvent after each step, and a final DoneEvent. ``max_width``:
    no forward that carries a draft feeds more tokens (the widest verify measured bit-identical; the prompt's
    prefill then runs without a draft, as the target-only decoder's does), and the prompt's rows are computed as a
    fresh prefill computes them (``Runner.resume``'s ``narrow``)."""
    k_policy = k_policy or FixedK(4)
    generator = make_generator(sampling.seed, target.logits_device)
    proposer.reset(prompt_ids, sampling, generator)
    stats = StatsTracker(proposer=proposer.name)
    context = list(prompt_ids)
    pos = target.resume(context, narrow=max_width)  # what the target's cache holds of it (gpt-fast's input_pos)
    while not stream.finished(cancel):
        clock = StepClock(target)
        # 1. propose (k = 0 asks only for free drafts, e.g. a prompt lookup; a model proposer returns none)
        choice = k_policy.choose(stream.remaining)
        room = stream.remaining - 1
        if max_width:
            room = max(0, min(room, max_width - (len(context) - pos)))
        draft, cut = _propose(proposer, k_policy, context, choice.k if room else 0, room=room)
        clock.lap()
        # 2. verify: one target forward over [tokens the target has not seen, *draft]
        fed = context[pos:] + draft.tokens
        p_target = logits_to_probs(target.forward(fed, n_logits=len(draft) + 1), sampling)  # (k+1, vocab)
        # 3. accept
        verdict = _verify(p_target, draft, sampling, generator)
        _record(clock.step(draft, verdict.n_accepted, len(fed)), choice, k_policy, stats, cut)
        # 4. roll back the target to the accepted prefix (the new token is fed next step)
        pos = len(context) + verdict.n_accepted
        target.rollback(pos)
        # 5. emit (with the most likely tokens of each emitted position, when the sampling asks for them)
        context += draft.tokens[: verdict.n_accepted] + [verdict.token]
        tops = top_tokens(p_target[: verdict.n_accepted + 1], sampling.candidates or 0)
        yield from _emit(stream, draft, verdict, p_target, tops, stats.acceptance.steps - 1)
        yield stats.snapshot(len(stream.token_ids))
    yield stream.done(stats.snapshot(len(stream.token_ids)))


def _propose(proposer: Proposer, k_policy: KPolicy, context: list[int], k: int,
             room: int) -> tuple[Draft, DraftCut | None]:
    """A draft of up to ``k`` model tokens, never more than ``room`` (tokens beyond it could never be emitted).
    A free (one-hot) draft may be longer than ``k``: it costs nothing to make, but each token widens the verify
    forward, so the k policy prices it and may cut it (to 0: a target-only step). Also what it cut (None: no cut)."""
    draft = proposer.propose(context, min(k, room))
    most = min(len(draft), room)  # the longest it can be kept: the k policy prices only the lengths it could keep
    limit = k_policy.free_limit(draft.evidence_class, most) if draft.free else None
    kept = draft.truncate(most if limit is None else min(most, limit))
    if limit is None or len(kept) >= most:
        return kept, None
    costs = k_policy.costs
    return kept, DraftCut(proposer.name, len(draft), len(kept), costs.verify_per_token_s if costs else None)


def _record(step: StepRecord, choice: KChoice, k_policy: KPolicy, stats: StatsTracker,
            cut: DraftCut | None = None) -> None:
    """The step's bookkeeping, in one place: the k policy learns from it, the stats count it (and the free draft
    it cut, ``cut``)."""
    k_policy.update(step)
    stats.record_step(step, fallback=choice.fallback, costs=k_policy.costs, cut=cut, waiting=choice.waiting)


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
