"""What the engine yields. Plain dataclasses: the app renders them, tests and the trace export read them.

Token kinds (same names in CSS classes, the legend and tests):
- ``accepted``: a draft token the target kept.
- ``corrected``: the target rejected the draft token at this position and emitted this one instead.
- ``bonus``: the target's extra token after a fully accepted draft.
- ``plain``: a token from a target-only step (reference decoder, or speculation switched off / in fallback).
- ``cached``: served from the semantic cache: as stored (direct mode, a trusted store), or once the target
  checked that it would give every token (an exact hit in verify mode, engine.serve.generation.check_hit).
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from engine.costs.costmodel import StepCosts

TOKEN_KINDS = ("accepted", "corrected", "bonus", "plain", "cached")


@dataclass(frozen=True)
class Candidate:
    """One token of a position's vocabulary, spelled on its own, with the target's probability of it there."""
    token_id: int
    text: str  # the token by itself: U+FFFD where it holds only part of a multi-byte character
    utf8: tuple[int, ...]  # its bytes; the parts of a character split over tokens join from these
    p_target: float | None  # None: no target distribution decided this position (a cached token)


@dataclass(frozen=True)
class Candidates:
    """What the target's distribution said at a token's position, when the sampling asks (SamplingConfig.candidates):
    the token emitted, and the most likely tokens there, most likely first. The distribution is p_target's (after
    temperature, top-k and top-p; the plain softmax when greedy); tokens those filters removed (probability 0) are
    left out, so ``top`` may be shorter than asked. A cached token has no distribution: no ``top``."""
    chosen: Candidate
    top: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class TokenEvent:
    token_id: int
    text: str  # decoded piece; "" while a multi-byte character is still incomplete
    kind: str  # one of TOKEN_KINDS
    step: int  # speculation step that emitted it (0-based)
    t: float  # seconds since generation started
    p_target: float | None = None  # target probability of this token (after temperature/top-p/top-k)
    q_draft: float | None = None  # draft probability of this token; None for one-hot drafts and non-draft tokens
    draft_pos: int | None = None  # position inside the draft (0-based) for accepted/corrected tokens
    rejected_token_id: int | None = None  # the draft token the target replaced (kind == "corrected")
    rejected_text: str | None = None  # a special token by its name, e.g. "<|im_end|>"
    # the rejected draft token is special: "end" (it would have ended the answer), "control" (any other), else None
    rejected_special: str | None = None
    candidates: Candidates | None = None  # only when SamplingConfig.candidates asks
    type: str = "token"

    def to_dict(self) -> dict:
        return asdict(self)


def _sum_by_pos(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    width = max(len(a), len(b))
    return tuple((a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(width))


@dataclass(frozen=True)
class Acceptance:
    """How the target took the drafts of a generation, or of several (``+`` sums them): the counts behind the
    acceptance rate, the cost model's alpha and the acceptance-by-position plot. ``add`` counts one more step."""
    steps: int = 0  # decode steps, target-only ones included
    proposed: int = 0  # draft tokens the target verified
    accepted: int = 0  # of them, accepted
    rejected_steps: int = 0  # steps whose draft had a rejected token (at most one per step: the first ends it)
    accepted_by_pos: tuple[int, ...] = ()  # accepted_by_pos[i]: drafts whose token i was accepted
    proposed_by_pos: tuple[int, ...] = ()  # proposed_by_pos[i]: drafts that had a token at position i

    def add(self, step) -> Acceptance:  # step: the loop's StepRecord (engine/decode/step.py)
        n, kept = step.n_drafted, step.n_accepted
        return self + Acceptance(1, n, kept, int(step.rejected), (1,) * kept + (0,) * (n - kept), (1,) * n)

    def __add__(self, other: Acceptance) -> Acceptance:
        return Acceptance(self.steps + other.steps, self.proposed + other.proposed, self.accepted + other.accepted,
                          self.rejected_steps + other.rejected_steps,
                          _sum_by_pos(self.accepted_by_pos, other.accepted_by_pos),
                          _sum_by_pos(self.proposed_by_pos, other.proposed_by_pos))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def alpha(self) -> float:
        """Per-token acceptance (accepted / (accepted + rejected steps)): the alpha of the cost model. A step
        ends at its first rejected token, so each rejected step is one rejection."""
        n = self.accepted + self.rejected_steps
        return self.accepted / n if n else 0.0

    @property
    def mean_accepted(self) -> float:
        """Mean number of draft tokens accepted per step."""
        return self.accepted / self.steps if self.steps else 0.0

    @property
    def mean_drafted(self) -> float:
        """Mean number of draft tokens verified per step (the mean k)."""
        return self.proposed / self.steps if self.steps else 0.0

    @property
    def rate_by_pos(self) -> tuple[float | None, ...]:
        """The acceptance rate at each draft position; None where no draft reached it."""
        return tuple(a / p if p else None for a, p in zip(self.accepted_by_pos, self.proposed_by_pos))

    def to_dict(self) -> dict:
        return {**asdict(self), "acceptance_rate": self.acceptance_rate, "alpha": self.alpha,
                "mean_accepted": self.mean_accepted}


@dataclass(frozen=True)
class DraftCut:
    """The k policy cut a free draft short: the tokens past ``kept`` would not have paid for the wider verify
    forward they need (``kept`` 0: the step ran target-only). The app puts it into words (app/views/stats.py)."""
    proposer: str  # whose draft it was (the stats' proposer name)
    drafted: int  # the draft's length as proposed
    kept: int  # the tokens the target verified
    verify_per_token_s: float | None = None  # what each verified token costs by the fitted step costs


@dataclass(frozen=True)
class StatsEvent:
    new_tokens: int
    elapsed_s: float
    k: int  # draft length used in the latest step
    acceptance: Acceptance = Acceptance()  # the steps so far and how their drafts fared
    proposer: str = ""
    fallback: bool = False  # True while speculation is paused (target-only steps)
    waiting: bool = False  # paused because this machine's step costs are still being measured (not for a loss)
    draft_s: float = 0.0  # time spent proposing
    verify_s: float = 0.0  # time spent in target forwards
    cut_steps: int = 0  # steps whose free draft the k policy cut or skipped: it would not have paid
    latest_cut: DraftCut | None = None  # the latest such cut
    costs: StepCosts | None = None  # the k policy's step costs fitted so far; None before a fit (or target-only)
    # each draft source's own share of ``acceptance`` (Draft.source: "prediction", "lookup", "fast-draft", …)
    by_source: tuple[tuple[str, Acceptance], ...] = ()
    first_token_s: float | None = None  # when the first token came, from the decode's start (its prefill)
    type: str = "stats"

    @property
    def tokens_per_s(self) -> float:
        """End to end: the answer's tokens over the seconds since its decode started, the prefill counted."""
        return self.new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def decode_tokens_per_s(self) -> float | None:
        """The decode rate: the tokens after the first over the seconds after it (None before a second token)."""
        if self.first_token_s is None or self.new_tokens < 2 or self.elapsed_s <= self.first_token_s:
            return None
        return (self.new_tokens - 1) / (self.elapsed_s - self.first_token_s)

    def of_source(self, source: str) -> Acceptance:
        """How the drafts of ``source`` fared (nothing drafted: an empty Acceptance)."""
        return dict(self.by_source).get(source, Acceptance())

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(acceptance=self.acceptance.to_dict(), tokens_per_s=self.tokens_per_s,
                 decode_tokens_per_s=self.decode_tokens_per_s,
                 by_source={name: a.to_dict() for name, a in self.by_source})
        return d


@dataclass(frozen=True)
class CacheEvent:
    """Outcome of the semantic-cache lookup, yielded before any token."""
    outcome: str  # "exact" | "verified" | "cached" (direct mode, served unverified) | "miss" | "off"
    matched_prompt: str | None = None
    similarity: float | None = None
    reason: str = ""  # why a semantic hit was verified instead of served (guards), or empty
    type: str = "cache"

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DoneEvent:
    finish_reason: str  # "eos" | "length" | "stop" (a stop string) | "cancelled"
    text: str
    token_ids: tuple[int, ...]
    stats: StatsEvent
    prompt_tokens: int = 0  # tokens of the prompt this answers (chat template included); 0 when not known
    type: str = "done"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["stats"] = self.stats.to_dict()
        return d


Event = TokenEvent | StatsEvent | CacheEvent | DoneEvent


def final_done(events: Iterable[Event]) -> DoneEvent:
    """Run a generation to its end and return its DoneEvent (every generation yields one, last)."""
    done = None
    for event in events:
        if event.type == "done":
            done = event
    if done is None:
        raise RuntimeError("the generation ended without a DoneEvent")
    return done
