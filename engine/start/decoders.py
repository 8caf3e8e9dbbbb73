"""Start a speculative or a target-only decode of loaded models: the one place that builds what a decode needs.

A decode gets runners (``engine.models.loading.runner_for``: a runner may hold tokens, and each decoder resumes
what is still valid of its prompt; the answer is the one an empty runner gives wherever the runner's rows are
batch-invariant, which the load-time identity check measures), the registry's proposer, the k policy of its
``SpecConfig`` and a token stream sized to the room the context window leaves. No forward runs until the returned
generator is advanced; the caller decides under which lock (engine/serve/model_lock.py for the chat).
"""
from __future__ import annotations

import threading
from collections.abc import Iterator

from engine.config import SamplingConfig, SpecConfig
from engine.decode.reference import reference_generate
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.events import Event
from engine.models.loading import LoadedModel, runner_for
from engine.proposers import PROPOSERS, Proposer
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.proposers.memory import AnswerMemory, MemoryProposer
from engine.proposers.prediction import PredictionProposer
from engine.costs.costmodel import StepCosts
from engine.decode.kpolicy import Waiting, policy_for


def answer_room(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig) -> int:
    """How many new tokens an answer to ``prompt_ids`` may have: the request's limit, within the context window."""
    return min(sampling.max_new_tokens, target.context_window - len(prompt_ids))


def token_stream(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig) -> TokenStream:
    """The stream of an answer to ``prompt_ids``: its clock starts now."""
    return TokenStream(target.tokenizer, target.eos_ids, answer_room(target, prompt_ids, sampling),
                       sampling.stop_on_eos, prompt_tokens=len(prompt_ids), candidates=sampling.candidates is not None,
                       stops=sampling.stop)


def make_proposer(spec: SpecConfig, draft: LoadedModel, cached_answer: tuple[int, ...] = (),
                  prediction: tuple[int, ...] = (), memory: AnswerMemory | None = None,
                  prompt_ids: list[int] | None = None) -> Proposer:
    """The registry's proposer for ``spec`` (only model drafts make a draft runner, for ``prompt_ids``). The free
    drafts a request brings go first: a ``cached_answer`` (engine/proposers/cached_answer.py), then the client's
    ``prediction`` (engine/proposers/prediction.py), then the instance's ``memory`` of earlier work
    (engine/proposers/memory.py), then that proposer."""
    proposer = PROPOSERS[spec.proposer](lambda: runner_for(draft, prompt_ids))
    if memory is not None and len(memory):
        proposer = MemoryProposer(memory, fallback=proposer)
    if prediction:
        proposer = PredictionProposer(list(prediction), fallback=proposer)
    return CachedAnswerProposer(list(cached_answer), fallback=proposer) if cached_answer else proposer


def start_speculative(target: LoadedModel, draft: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig,
                      spec: SpecConfig, *, costs: StepCosts | None = None, cached_answer: tuple[int, ...] = (),
                      prediction: tuple[int, ...] = (), stream: TokenStream | None = None,
                      cancel: threading.Event | None = None, width_cap: int | None = None,
                      measuring: bool = False, memory: AnswerMemory | None = None) -> Iterator[Event]:
    """The draft-verify loop on ``target`` and ``draft``. ``costs`` (the pair's step costs measured at load)
    starts the k policy's cost model; ``measuring``: they are still being measured, and an adaptive k waits for them
    with target-only steps (kpolicy's Waiting); ``stream`` defaults to :func:`token_stream`. ``width_cap``: the widest verify
    the load-time identity check found bit-identical (IdentityCheck.width_cap), which an adaptive k keeps to.
    ``cached_answer``, ``prediction`` and ``memory``: free drafts the request brings (:func:`make_proposer`)."""
    stream = stream or token_stream(target, prompt_ids, sampling)
    cap = width_cap if spec.adaptive else None  # a fixed k is the user's choice
    proposer = make_proposer(spec, draft, cached_answer, prediction, memory, prompt_ids)
    k_policy = Waiting() if measuring and spec.adaptive else policy_for(spec, costs, width=cap)
    return speculative_generate(runner_for(target, prompt_ids), proposer, prompt_ids, stream, sampling, k_policy,
                                cancel=cancel, narrow=cap)


def start_reference(target: LoadedModel, prompt_ids: list[int], sampling: SamplingConfig, *,
                    stream: TokenStream | None = None, cancel: threading.Event | None = None,
                    width_cap: int | None = None) -> Iterator[Event]:
    """Target-only decoding: the reference every speculative answer must match. ``width_cap``: the widest forward
    the identity check found bit-identical (IdentityCheck.width_cap): the prompt's rows are then computed as a fresh
    prefill computes them, whatever a pooled runner held, as an ``identical`` speculative decode computes them."""
    stream = stream or token_stream(target, prompt_ids, sampling)
    return reference_generate(runner_for(target, prompt_ids), prompt_ids, stream, sampling, cancel, narrow=width_cap)
