"""A divergence between two greedy answers, explained in words (for the race panel and the exported trace).

Reads ``engine.divergence.Divergence`` / ``Fp32Proof`` by attribute (or their ``to_dict()``), so the app
needs no torch. Every piece of model text is escaped.
"""
from __future__ import annotations

from app.views.render import esc


def _get(obj, name: str):
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name)


def _token(text: str, token_id) -> str:
    return "the end of the answer" if token_id is None else f"{text!r} (id {token_id})"


def divergence_text(div) -> str:
    """Plain words: where, which tokens, the margin, and what it means."""
    pos, precision = _get(div, "position"), _get(div, "precision")
    step, margin, top = _get(div, "rounding_step"), _get(div, "top2_margin"), _get(div, "top_logit")
    gap = _get(div, "tokens_gap")
    head = (f"The answers first differ at token {pos}: target-only chose "
            f"{_token(_get(div, 'reference_text'), _get(div, 'reference_token'))}, speculative chose "
            f"{_token(_get(div, 'other_text'), _get(div, 'other_token'))}. The target's top-2 logit margin there "
            f"is {margin:.4g}" + ("" if gap is None else f" (between these two tokens: {gap:.4g})") +
            f"; {precision} logits near {top:.3g} are {step:.3g} apart.")
    within = div["within_rounding"] if isinstance(div, dict) else div.within_rounding
    if within:
        return (head + f" That is a tie within {precision} rounding, not a speculation error: the target scores "
                "a token alone when it decodes by itself and inside a k+1-token forward when it verifies a draft, "
                "the two sums round differently, and a tie can break either way. In fp32 both answers agree.")
    return (head + f" That margin is far above {precision} rounding, so rounding cannot explain it: this would be "
            "a bug in the speculative decoding. Please report it with the exported trace.")


def divergence_html(div) -> str:
    if div is None:
        return ""
    css = "race-tie" if (div["within_rounding"] if isinstance(div, dict) else div.within_rounding) else "race-bug"
    return (f'<div class="race-divergence {css}" data-position="{esc(_get(div, "position"))}">'
            f"{esc(divergence_text(div))}</div>")


def proof_text(proof) -> str:
    timing = f"{_get(proof, 'seconds'):.1f} s for both decodes"
    if _get(proof, "load_seconds") >= 0.05:
        timing += f", plus {_get(proof, 'load_seconds'):.1f} s loading the fp32 copies"
    if _get(proof, "identical"):
        return f"✓ identical in fp32: {_get(proof, 'n_tokens')} tokens, target-only and speculative ({timing})."
    div = _get(proof, "divergence")
    where = "" if div is None else " " + divergence_text(div)
    return f"✗ still different in fp32 ({timing}).{where}"


def proof_html(proof) -> str:
    css = "race-ok" if _get(proof, "identical") else "race-bad"
    return f'<div class="race-proof"><span class="{css}">{esc(proof_text(proof))}</span></div>'
