"""Pure verification: given target distributions over [cur, *draft], decide what to keep.

Names: ``p_target`` is the target's distribution, ``q_draft`` the draft's. A ``Verdict`` says how many draft
tokens were accepted and which token the target adds after them: a ``corrected`` token at the first
rejection, or a ``bonus`` token when the whole draft was accepted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Verdict:
    n_accepted: int
    token: int  # the target's own token after the accepted prefix
    kind: str  # "corrected" | "bonus"


def verify_greedy(p_target: torch.Tensor, draft_tokens: list[int]) -> Verdict:
    """p_target: (k+1, vocab). Accept while the draft token is the target's argmax."""
    k = len(draft_tokens)
    choices = torch.argmax(p_target, dim=-1).tolist()  # (k+1,)
    n = 0
    while n < k and choices[n] == draft_tokens[n]:
        n += 1
    return Verdict(n, choices[n], "bonus" if n == k else "corrected")


def verify_rejection(p_target: torch.Tensor, draft_tokens: list[int], q_draft: torch.Tensor | None,
                     generator: torch.Generator | None) -> Verdict:
    """Lossless rejection sampling (Leviathan et al. / Chen et al.).

    p_target: (k+1, vocab); q_draft: (k, vocab), or None for a one-hot draft (n-gram, cached answer).
    Token i is accepted with probability min(1, p/q); the first rejected position is resampled from
    norm(max(0, p - q)); if all k are accepted, a bonus token is drawn from p_target[k].
    """
    k = len(draft_tokens)
    if k:
        device = p_target.device  # the model's: the logits never leave it
        rows, idx = torch.arange(k, device=device), torch.tensor(draft_tokens, device=device)
        p_tok = p_target[rows, idx]  # (k,)
        q_tok = q_draft[rows, idx] if q_draft is not None else torch.ones(k, device=device)
        u = torch.rand(k, generator=generator, device=device)
        accepted = (u * q_tok <= p_tok) & (p_tok > 0)  # u < p/q without dividing
        rejected = (~accepted).nonzero()
        n = int(rejected[0]) if len(rejected) else k
    else:
        n = 0
    if n == k:
        return Verdict(k, int(torch.multinomial(p_target[k], 1, generator=generator)), "bonus")
    residual = _residual(p_target[n], q_draft[n] if q_draft is not None else None, draft_tokens[n])
    return Verdict(n, int(torch.multinomial(residual, 1, generator=generator)), "corrected")


def _residual(p: torch.Tensor, q: torch.Tensor | None, rejected_token: int) -> torch.Tensor:
    """norm(max(0, p - q)); a one-hot q removes only the rejected token."""
    if q is None:
        residual = p.clone()
        residual[rejected_token] = 0.0
    else:
        residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    # p == q exactly gives zero mass; the rejection then had probability 0 in exact arithmetic, so any p-sample is fine
    return residual / total if total > 0 else p
