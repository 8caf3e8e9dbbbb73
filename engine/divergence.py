"""Where two greedy answers first differ, and whether the target's choice there was a rounding tie.

Greedy speculative decoding must give the target-only tokens. In bf16 it can still differ: the target scores
a token once alone (target-only) and once inside a k+1-token verify forward, the two sums round differently,
and when the top two logits are within a rounding step of each other the argmax can flip. That is a tie, not
a speculation error; a divergence where the margin is far above the rounding step would be a bug.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from engine.models.loading import LoadedModel, runner_for
from engine.backends.contract import common_prefix
from engine.precision import rounding_step, tie_margin


@dataclass(frozen=True)
class Divergence:
    position: int  # index of the first differing answer token
    reference_token: int | None  # the target-only token there; None when that answer had already ended
    other_token: int | None  # the other (speculative) answer's token; None when it had ended
    reference_text: str
    other_text: str
    top_logit: float  # the target's largest logit at that position (after the shared prefix)
    top2_margin: float  # largest minus second-largest logit
    tokens_gap: float | None  # |logit(reference token) - logit(other token)|; None when one answer had ended
    precision: str  # the target's precision
    rounding_step: float  # spacing of the target's logits near ``top_logit``

    @property
    def within_rounding(self) -> bool:
        gap = self.top2_margin if self.tokens_gap is None else self.tokens_gap
        return gap <= tie_margin(self.precision, self.top_logit)

    def to_dict(self) -> dict:
        return {**asdict(self), "within_rounding": self.within_rounding}


@dataclass(frozen=True)
class Fp32Proof:
    """Both decodes of the same prompt again with fp32 copies of the pair."""
    identical: bool
    n_tokens: int
    divergence: Divergence | None
    seconds: float  # both decodes
    load_seconds: float  # loading the fp32 copies (0 when cached)
    target: str
    draft: str

    def to_dict(self) -> dict:
        d = asdict(self)
        d["divergence"] = None if self.divergence is None else self.divergence.to_dict()
        return d


@torch.inference_mode()
def top_logits(target: LoadedModel, ids: list[int]) -> torch.Tensor:
    """The target's logits for the token after ``ids``, one prefill forward: (vocab,)."""
    return _forward(target, list(ids), 1)[-1]


def _forward(target: LoadedModel, ids: list[int], n_logits: int) -> torch.Tensor:
    """One forward of ``ids`` on an emptied runner of ``target``: the last ``n_logits`` rows of logits, on the CPU."""
    runner = runner_for(target)
    runner.reset()  # a runner may hold tokens (a pooled context): this forward must see only ``ids``
    return runner.forward(ids, n_logits=n_logits).float().cpu()


@torch.inference_mode()
def first_disagreement(target: LoadedModel, prompt_ids: list[int], answer_ids: list[int],
                       ends: bool = True) -> int | None:
    """Where the target, greedy, would not give ``answer_ids`` (and then end, when ``ends``), judged in one
    forward: the first position whose token sits more than a rounding tie (:func:`tie_margin`) below the top
    logit, or ``len(answer_ids)`` when no end-of-answer token is within a tie of the top there; None when it
    would say exactly this. One long forward rounds differently from the decode that wrote the answer, so a
    bf16 target would otherwise re-decide its own ties (fp32's steps are tiny: there it is all but the plain argmax)."""
    n = len(answer_ids)
    if len(prompt_ids) + n >= target.context_window:
        return 0
    logits = _forward(target, list(prompt_ids) + list(answer_ids), n + 1)  # (n+1, vocab)
    eos = sorted(target.eos_ids)
    for i, row in enumerate(logits):
        if i == n and not (ends and target.eos_ids):
            break
        top = float(row.max())
        wanted = float(row[answer_ids[i]]) if i < n else float(row[eos].max())
        if top - wanted > tie_margin(target.precision, top):
            return i
    return None


def first_divergence(target: LoadedModel, prompt_ids: list[int], reference: list[int],
                     other: list[int]) -> Divergence | None:
    """The first position where ``other`` leaves ``reference``, with the target's top-2 margin there."""
    position = common_prefix(list(reference), list(other))
    if position == len(reference) == len(other):
        return None
    logits = top_logits(target, list(prompt_ids) + list(reference[:position]))  # (vocab,)
    top2 = torch.topk(logits, 2).values

    def token(ids: list[int]) -> int | None:
        return ids[position] if position < len(ids) else None

    def text(tok: int | None) -> str:
        return "(end of answer)" if tok is None else target.tokenizer.decode([tok])

    ref_tok, other_tok = token(reference), token(other)
    top = float(top2[0])
    gap = None if ref_tok is None or other_tok is None else abs(float(logits[ref_tok] - logits[other_tok]))
    return Divergence(position=position, reference_token=ref_tok, other_token=other_tok,
                      reference_text=text(ref_tok), other_text=text(other_tok), top_logit=top,
                      top2_margin=float(top2[0] - top2[1]), tokens_gap=gap, precision=target.precision,
                      rounding_step=rounding_step(target.precision, top))
