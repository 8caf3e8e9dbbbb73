"""Guards: cheap lexical checks that stop a semantic-cache hit from being served unverified.

Sentence embeddings blur exactly the details that change an answer ("100 Celsius to Fahrenheit" vs
"100 Fahrenheit to Celsius": cosine 0.99). Each guard is a pure function ``guard(a, b) -> str | None``:
``None`` means "no difference found", a string says what differs. A failing guard never loses an answer,
it only sends the hit through target verification, so the guards are deliberately strict.

Both prompts go through :func:`engine.cache.analysis.analyse` (normalised text, numbers with their units,
negations, canonical terms); the guards compare the two analyses.
"""
from __future__ import annotations

from collections import Counter

from engine.cache.analysis import GENERIC, MARKERS, Analysis, analyse

# ---- guards -----------------------------------------------------------------------------------
def _show(items) -> str:
    return ", ".join(sorted(items)) or "nothing"


def numbers_guard(a: str, b: str) -> str | None:
    """Numbers (digits, number words, ordinals) and their units must match as a multiset."""
    na, nb = Counter(analyse(a).numbers), Counter(analyse(b).numbers)
    if na == nb:
        return None
    show = lambda c: _show(f"{v} {u}".strip() for v, u in c.elements())  # noqa: E731
    return f"numbers differ: {show(na - nb)} vs {show(nb - na)}"


def negation_guard(a: str, b: str) -> str | None:
    """The same negation cues (not, never, without, no, n't, ...) must appear in both."""
    na, nb = Counter(analyse(a).negations), Counter(analyse(b).negations)
    return None if na == nb else f"negation differs: {_show(na.elements())} vs {_show(nb.elements())}"


def _linked(x: Analysis, i: int, j: int) -> tuple[bool, frozenset[str]]:
    """Is there a relation word between positions i and j, and which content terms sit between them."""
    lo, hi = min(i, j), max(i, j)
    has_marker = any(t in MARKERS for t in x.tokens[lo + 1:hi])
    return has_marker, frozenset(t for t, k in x.terms if lo < k < hi)


def order_guard(a: str, b: str) -> str | None:
    """Shared terms joined the same way ("A to B", "A slower than B") must keep their order.

    A pair that is swapped counts only if, in both prompts, a relation word sits between the two terms
    and the same content terms sit between them ("Python list" vs "list in Python" is not a swap).
    """
    xa, xb = analyse(a), analyse(b)
    pa, pb = {}, {}
    for terms, pos in ((xa.terms, pa), (xb.terms, pb)):
        for term, i in terms:
            pos.setdefault(term, i)
    shared = sorted(set(pa) & set(pb), key=pa.__getitem__)
    for k, x in enumerate(shared):
        for y in shared[k + 1:]:
            if pb[x] < pb[y]:
                continue
            link_a, link_b = _linked(xa, pa[x], pa[y]), _linked(xb, pb[x], pb[y])
            if link_a[0] and link_a == link_b:
                return f"order differs: '{x} ... {y}' vs '{y} ... {x}'".replace("#", "")
    return None


def entity_guard(a: str, b: str) -> str | None:
    """Content words (names, languages, technical terms, verbs) must match after normalisation.

    Generic words (request verbs such as explain/compute, light verbs, generic nouns) may appear on one
    side only; a different generic word on each side still counts as a difference.
    """
    ta = {t for t, _ in analyse(a).terms if not t.startswith("#")}
    tb = {t for t, _ in analyse(b).terms if not t.startswith("#")}
    only_a, only_b = ta - tb, tb - ta
    if (only_a - GENERIC) or (only_b - GENERIC):
        return f"different key terms: {_show(only_a)} vs {_show(only_b)}"
    if only_a and only_b:
        return f"different request words: {_show(only_a)} vs {_show(only_b)}"
    return None


GUARDS = {"numbers": numbers_guard, "negation": negation_guard, "order": order_guard, "entities": entity_guard}


def failed_guards(a: str, b: str) -> list[str]:
    """Reasons from every guard that fails, in a fixed order; empty when the pair looks equivalent."""
    return [reason for guard in GUARDS.values() if (reason := guard(a, b)) is not None]


HARD_GUARDS = ("numbers", "negation", "order")  # differences a paraphrase judge may not overrule


def judge_may_overrule(a: str, b: str) -> bool:
    """True when only the key-terms guard fails (synonyms, rewording): a paraphrase judge may then serve it."""
    return all(GUARDS[name](a, b) is None for name in HARD_GUARDS)


def judge_decides(a: str, b: str, reasons: list[str] | None = None) -> bool:
    """Whether direct mode asks the paraphrase judge about this hit: a guard fails (``reasons``, failed_guards'
    when given) and it is one the judge may overrule. What the cache does, and what calibration scores."""
    reasons = failed_guards(a, b) if reasons is None else reasons
    return bool(reasons) and judge_may_overrule(a, b)
