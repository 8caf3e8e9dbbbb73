"""Bookkeeping shared by the speculative loop and the reference decoder: output tokens, stop rules, stats."""
from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.costs.costmodel import StepCosts
from engine.decode.step import StepBudget, StepRecord
from engine.decode.detok import IncrementalDetokenizer, TokenSpeller
from engine.events import Acceptance, Candidates, DoneEvent, DraftCut, StatsEvent, TokenEvent


class TokenStream:
    """Turns accepted token ids into TokenEvents; knows when to stop (EOS, length, a stop string). With
    ``candidates`` each event carries its Candidates: the token spelled on its own and the alternatives the decoder
    passes to ``emit``. ``stops``: the token whose text completes one of these strings is the answer's last (finish
    reason ``stop``), so a decoder that emits a step's tokens stops within that step."""

    def __init__(self, tokenizer, eos_ids: frozenset[int], max_new_tokens: int, stop_on_eos: bool = True,
                 prompt_tokens: int = 0, candidates: bool = False, stops: tuple[str, ...] = ()):
        self.detok = IncrementalDetokenizer(tokenizer)
        self.speller = TokenSpeller(tokenizer) if candidates else None
        self.prompt_tokens = prompt_tokens  # the prompt this answers (chat template included), for usage
        self.eos_ids = eos_ids if stop_on_eos else frozenset()
        self.end_ids = eos_ids  # what a rejected draft token is called: "end" even when the answer may go on
        self.special_ids = frozenset(getattr(tokenizer, "all_special_ids", None) or ())
        self.max_new_tokens = max_new_tokens
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stops = stops
        self._tail = ""  # the end of the text, as long as the longest stop string: where a new one can appear
        self.t0 = time.perf_counter()

    def finished(self, cancel: threading.Event | None = None) -> bool:
        """True once the answer is complete (EOS, length) or ``cancel`` is set (finish reason ``cancelled``).

        The one stop check of both decoders, called before each step: a cancel takes effect at the next step.
        """
        if not self.finish_reason and cancel is not None and cancel.is_set():
            self.finish_reason = "cancelled"
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.token_ids)

    def emit(self, token_id: int, kind: str, step: int, top: Sequence[tuple[int, float]] = (),
             **info) -> TokenEvent | None:
        """Record one token; None (and finished) when it is EOS. ``top``: the most likely (token id, p_target) at its
        position, kept when the stream spells candidates."""
        if self.finish_reason:
            return None
        if token_id in self.eos_ids:
            self.finish_reason = "eos"
            return None
        self.token_ids.append(token_id)
        if len(self.token_ids) >= self.max_new_tokens:
            self.finish_reason = "length"
        if info.get("rejected_token_id") is not None:
            info.update(self._rejected(info["rejected_token_id"]))
        if self.speller is not None:
            info["candidates"] = Candidates(self.speller.candidate(token_id, info.get("p_target")),
                                            tuple(self.speller.candidate(i, p) for i, p in top))
        text = self.detok.push(token_id)
        if self.stops and text:
            self._stop_at(text)
        return TokenEvent(token_id=token_id, text=text, kind=kind, step=step, t=time.perf_counter() - self.t0,
                          **info)

    def _stop_at(self, text: str) -> None:
        """Finish (reason ``stop``) when ``text`` completes a stop string; only the tail can hold a new one."""
        window = self._tail + text
        if any(s in window for s in self.stops):
            self.finish_reason = "stop"
        self._tail = window[-max(len(s) for s in self.stops):]

    def _rejected(self, token_id: int) -> dict:
        """The rejected draft token's text (a special token by its name, e.g. ``<|im_end|>``) and what kind of
        special token it is: "end" (it would have ended the answer), "control" (another special token) or None."""
        special = "end" if token_id in self.end_ids else "control" if token_id in self.special_ids else None
        text = self.detok.tokenizer.decode([token_id], skip_special_tokens=False)
        return {"rejected_text": text, "rejected_special": special}

    def done(self, stats: StatsEvent) -> DoneEvent:
        """The final event; its text is exactly the streamed pieces joined."""
        return DoneEvent(finish_reason=self.finish_reason or "length", text=self.detok.text(),
                         token_ids=tuple(self.token_ids), stats=stats, prompt_tokens=self.prompt_tokens)


@dataclass
class StatsTracker:
    proposer: str = ""
    acceptance: Acceptance = Acceptance()
    draft_s: float = 0.0
    verify_s: float = 0.0
    k: int = 0
    fallback: bool = False
    waiting: bool = False  # the k policy waits for this machine's step costs (engine/serve/measuring.py)
    costs: StepCosts | None = None  # the k policy's fitted step costs
    cut_steps: int = 0  # steps whose free draft the k policy cut (or skipped): it would not have paid
    latest_cut: DraftCut | None = None
    by_source: dict[str, Acceptance] = field(default_factory=dict)  # the drafting steps of each Draft.source
    first_token_s: float | None = None  # seconds from t0 to the end of the step that emitted the first token
    t0: float = field(default_factory=time.perf_counter)

    def record_step(self, step: StepRecord, budget: StepBudget | None = None, costs: StepCosts | None = None,
                    cut: DraftCut | None = None) -> None:
        """Count one step; ``budget`` and ``costs`` are the k policy's as of this step (a target-only decoder has
        none), ``cut`` the free draft its budget cut in this step (priced here at the fitted verify cost)."""
        self.acceptance = self.acceptance.add(step)
        if step.n_drafted:
            self.by_source[step.source] = self.by_source.get(step.source, Acceptance()).add(step)
        if cut is not None:
            per_token = costs.verify_per_token_s if costs is not None else None
            self.cut_steps, self.latest_cut = self.cut_steps + 1, replace(cut, verify_per_token_s=per_token)
        fallback, waiting = (budget.fallback, budget.waiting) if budget is not None else (False, False)
        self.k = step.n_drafted
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s
        self.fallback, self.costs, self.waiting = fallback, costs, waiting

    def snapshot(self, new_tokens: int) -> StatsEvent:
        elapsed = time.perf_counter() - self.t0
        if self.first_token_s is None and new_tokens:
            self.first_token_s = elapsed
        return StatsEvent(new_tokens=new_tokens, elapsed_s=elapsed, k=self.k, first_token_s=self.first_token_s,
                          acceptance=self.acceptance, proposer=self.proposer, fallback=self.fallback,
                          waiting=self.waiting,
                          draft_s=self.draft_s, verify_s=self.verify_s, cut_steps=self.cut_steps,
                          latest_cut=self.latest_cut, costs=self.costs, by_source=tuple(self.by_source.items()))
