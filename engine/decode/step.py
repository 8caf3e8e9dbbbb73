"""One step's budget and one step's record: what the k policy allows a step to draft, and what the step did.

The loop (engine/decode/speculative.py) asks the k policy once per step for a ``StepBudget``: a draft model's k,
the longest free span (known text: a prediction, a prompt lookup, a cached answer, the memory), the widest verify
allowed, and why. Proposers draft within it (``Proposer.propose(context, budget)``); a free draft is then cut to
what its evidence pays (``StepBudget.keep``). Every cap on a step lives here: the tokens the answer may still
have, the identical mode's widest bit-identical verify, the span free drafts are priced up to. The step's
``StepRecord`` is what the k policy and the stats learn from.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.events import DraftCut


@dataclass(frozen=True)
class StepRecord:
    """What one draft-verify step did and took: what the k policy and the stats learn from, made once per step
    by the loop. A draft is a model's (``free`` False: each token cost a draft forward) or one-hot (``free``: a
    prompt lookup, a cached answer); a plain target step drafted nothing."""
    n_drafted: int  # draft tokens the target verified
    n_accepted: int  # of them, accepted
    n_fed: int  # tokens the target's forward took: the ones it had not seen, then the draft
    draft_s: float  # seconds to propose
    verify_s: float  # seconds of the target's forward and the accept rule
    free: bool = False  # a one-hot draft: it cost nothing to make
    source: str = ""  # who drafted it (Draft.source): the stats count each source's acceptance apart
    evidence: str = ""  # a free draft's evidence class (Draft.evidence_class): FreeDrafts prices each apart
    draft_fed: int = 0  # tokens a draft model's forwards took (Draft.fed): its catch-up, then its own drafted tokens
    # a free draft this step's budget cut to nothing (its class in ``evidence``): whether the target's token was its
    # first, what a 1-token span would have shown at no cost; None where no free draft was priced out
    unverified_agreed: bool | None = None

    @property
    def n_model_drafted(self) -> int:
        """Draft tokens a draft model made (0 for a free draft)."""
        return 0 if self.free else self.n_drafted

    @property
    def caught_up(self) -> int:
        """Tokens the draft model fed beyond one a drafted token (what it had missed, ``Proposer.behind``): its
        catch-up. Its first forward feeds the catch-up and the step's newest token, each later one a drafted token."""
        return max(0, self.draft_fed - self.n_model_drafted) if self.n_model_drafted else 0

    @property
    def rejected(self) -> bool:
        """The target rejected one of the draft's tokens (the step ended on a corrected token)."""
        return self.n_accepted < self.n_drafted


def _no_pricing(evidence: str, most: int) -> int | None:
    return None


@dataclass(frozen=True)
class StepBudget:
    """What one step may draft, said once by the k policy, and why.

    ``k``: a draft model's tokens (0: none; free drafts may still come). ``span``: the longest free draft kept.
    ``width``: the widest verify the step may feed (None: no limit), already within ``k`` and ``span``.
    ``price(evidence, most)``: the length a free draft of that evidence class pays up to (``most``: the longest
    it could be kept), None where nothing is priced yet. ``why``: what set the budget, for traces and tests."""
    k: int
    span: int
    why: str
    fallback: bool = False  # speculation measured as losing: a plain target step, or a probe between them
    waiting: bool = False  # no draft at all: this machine's step costs are still being measured
    price: Callable[[str, int], int | None] = field(default=_no_pricing, compare=False, repr=False)

    @classmethod
    def within(cls, k: int, span: int, why: str, *, remaining: int | None, unseen: int, width: int | None,
               fallback: bool = False, waiting: bool = False,
               price: Callable[[str, int], int | None] = _no_pricing) -> StepBudget:
        """A budget of ``k`` and ``span`` cut to the room: tokens beyond the answer's last (``remaining`` may still
        be emitted, one of them the target's own) could never be emitted, and a forward that carries a draft feeds
        at most ``width`` tokens.

        No step drafts while the target has more than one token to take (the prompt, or what a reused runner did
        not hold of it): those are fed alone, as the target-only decoder feeds them, so the prompt's rows in the
        cache and the first token are the reference's by construction. A draft folded into the prefill made the
        prefill wider, and a wider forward may round every row otherwise (torch's int4 kernel and bf16 attention
        on an AMX CPU did: docs/engine.md, "The prompt is fed alone"). The first token also comes sooner."""
        if unseen > 1:
            return cls(0, 0, f"{why}; the prompt's {unseen} tokens are fed alone first", fallback, waiting, price)
        room = max(k, span) if remaining is None else max(0, remaining - 1)
        reason = why
        if width:
            fits = max(0, width - 1)  # the step's newest token, then the draft
            if fits < room:
                room, reason = fits, f"{why}; verify width <= {width}"
        if room < max(k, span) and reason == why:
            reason = f"{why}; {room} tokens of room"
        return cls(min(k, room), min(span, room), reason, fallback, waiting, price)

    def keep(self, draft):  # a Draft (engine/decode/draft.py, which hands proposers this budget) -> (Draft, cut)
        """``draft`` within this budget: a model's draft within ``k``, a free one within ``span`` and cut to what
        its evidence pays (to 0: a target-only step); also what was cut (None: nothing)."""
        most = min(len(draft), self.span if draft.free else self.k)
        limit = self.price(draft.evidence_class, most) if draft.free else None
        kept = draft.truncate(most if limit is None else min(most, limit))
        if limit is None or len(kept) >= most:
            return kept, None
        return kept, DraftCut(draft.source, len(draft), len(kept), None)
