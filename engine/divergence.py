"""Where two greedy answers first differ, and whether the target's choice there was a rounding tie.

Greedy speculative decoding must give the target-only tokens. In bf16 it can still differ: the target scores
a token once alone (target-only) and once inside a k+1-token verify forward, the two sums round differently,
and when the top two logits are within a rounding step of each other the argmax can flip. That is a tie, not
a speculation error; a divergence where the margin is far above the rounding step would be a bug.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from engine.config import rounding_step  # noqa: F401 (engine.divergence.rounding_step, as before)
from engine.models.loading import LoadedModel, runner_for
from engine.backends.contract import common_prefix

# A hint, never a promise: the precisions whose CPU kernels compute each output row from its own input row, so that
# with row-exact attention (engine/models/attention.py) a verify row can equal the same token fed alone. Whether it
# does on this machine is measured when a pair loads (engine/decode/identity.py, PairInfo.bit_identical); the tests
# check it at the shipped models' sizes (tests/backends/test_invariance.py). The others round differently between the two
# shapes, so an argmax can flip where the top two logits are that close: a rounding tie (``tie_margin``).
BATCH_INVARIANT = frozenset({"int8-weight", "int4"})
# The one tie rule, for every precision and both uses (a divergence's explanation, the exact-hit check): a gap of
# up to ``tie_steps(precision)`` rounding steps of the top logit is a tie. That is about twice the drift measured
# between a token scored alone and inside a verify forward (SmolLM2, k = 1..16, AVX-512 BF16 CPU: bf16 4.25 steps,
# fp32 30 fp32 steps, MKL's GEMM blocking by row count; tests/backends/test_invariance.py checks the bound holds here).
# fp32 gets more steps: its logits are spaced 2^16 times finer than bf16's, the accumulated GEMM error is not.
# gguf (llama.cpp): the load-time check measured 9.1 steps (1.5B) and 8.5 (SmolLM2) on an AVX2 Zen 3, so 16.
TIE_STEPS = {"fp32": 64, "gguf": 16}
DEFAULT_TIE_STEPS = 8


def tie_steps(precision: str) -> int:
    return TIE_STEPS.get(precision, DEFAULT_TIE_STEPS)


def tie_margin(precision: str, top_logit: float) -> float:
    """The largest gap below ``top_logit`` that is still a rounding tie in ``precision``."""
    return tie_steps(precision) * rounding_step(precision, top_logit)


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
