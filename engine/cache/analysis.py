"""How the guards read a prompt: contractions expanded, numbers and units parsed, stopwords dropped, a small
synonym table and light stemming applied (:func:`analyse`). The word lists are general English.

Both prompts of a pair get the same treatment, so a rule here only has to be consistent, not linguistically
complete; the guards that compare two analyses are in :mod:`engine.cache.guards`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

# ---- word lists -------------------------------------------------------------------------------
STOPWORDS = frozenset("""
a an the this that these those it its i me my mine we us our ours you your yours he him his she her they
them their is are was were be been being am do does did done doing will would shall should can could
may might must and or but if so as at by for from in into of on onto to with about than over per via vs
versus between what which how why whether there here also just very really actually exactly basically
please thanks thank hi hello hey ok okay kindly tell show give share provide let know want wish like help
way ways method approach someone something anyone anything use using used uses""".split())
NEGATIONS = frozenset("not no never without none nobody nothing nowhere neither nor non except excluding".split())
MARKERS = frozenset("""to into in from of for with than by over per vs versus before after toward towards onto
against at on under above below times minus plus divided power then""".split())
# One-sided extras that do not change what is asked: request verbs, light verbs, generic head nouns.
GENERIC = frozenset("""explain compute convert make get have appear
thing stuff item kind city country place person""".split())
_SYNONYM_GROUPS = """
explain: explanation describe description define definition meaning mean overview; convert: conversion
compute: calculate calc determine evaluate find return solve; make: made; have: has had; get: got gotten
write: wrote written author writer; paint: painter painted; invent: inventor invented; create: creator created
discover: discoverer discovered; remove: delete erase eliminate; undo: revert rollback; last: latest newest
differ: difference different distinguish compare comparison; appear: seem look become
begin: start started began begun beginning; end: ended finish finished
big: large huge; biggest: largest; bigger: larger; small: little tiny; fast: quick rapid; fastest: quickest
faster: quicker; tallest: highest; taller: higher; buy: purchase; child: children kid kids
picture: image photo photograph; dict: dictionary dictionaries; int: integer; string: str; bool: boolean
function: func; javascript: js; typescript: ts; cplusplus: cpp; postgresql: postgres; kubernetes: k8s
regex: regexp"""
_UNIT_GROUPS = """
percent: percentage pct; km: kilometer kilometers kilometre kilometres; m: meter meters metre metres
cm: centimeter centimeters centimetre centimetres; mm: millimeter millimeters millimetre millimetres
mi: mile miles; ft: foot feet; inch: inches; yd: yard yards; kg: kilogram kilograms kilo kilos; g: gram grams
lb: lbs pound pounds; oz: ounce ounces; l: liter liters litre litres; gal: gallon gallons
ml: milliliter milliliters millilitre millilitres; celsius: centigrade; fahrenheit: ; kelvin:
s: sec secs second seconds; min: mins minute minutes; h: hr hrs hour hours; day: days; week: weeks
month: months; year: years yr yrs; usd: dollar dollars; eur: euro euros; gbp: sterling; byte: bytes
kb: kilobyte kilobytes; mb: megabyte megabytes; gb: gigabyte gigabytes; tb: terabyte terabytes
mph: ; kmh: kph"""


def _groups(text: str) -> dict[str, str]:
    """"head: w1 w2; head2: w3" -> {head: head, w1: head, w2: head, head2: head2, w3: head2}."""
    table = {}
    for group in text.replace("\n", ";").split(";"):
        if group.strip():
            head, rest = group.split(":")
            table.update({w: head.strip() for w in [head.strip(), *rest.split()]})
    return table


SYNONYMS, UNITS = _groups(_SYNONYM_GROUPS), _groups(_UNIT_GROUPS)
UNITS_AFTER_NUMBER = {**UNITS, "c": "celsius", "f": "fahrenheit"}
_NUMS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
NUMBER_WORDS = {**{w: float(i) for i, w in enumerate(_NUMS)},
                **{w: 10.0 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(),
                                                      start=2)},
                "half": 0.5}
SCALES = {"hundred": 1e2, "thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12, "dozen": 12.0}
ORDINALS = {w: float(i) for i, w in enumerate(("first second third fourth fifth sixth seventh eighth ninth tenth "
                                               "eleventh twelfth thirteenth fourteenth fifteenth sixteenth "
                                               "seventeenth eighteenth nineteenth twentieth").split(), 1)}
PHRASES = (
    (r"\bmost recent\b", "latest"), (r"\broll(?:ed|ing)? back\b", "rollback"),
    (r"\b(?:work|figure) out\b", "compute"), (r"\b(?:in )?(?:what|which) (?:year|time)\b", "when"),
    (r"\bhow (?:do|would|can|could) (?:you|i|we|one) say\b", "translate"),
    (r"\b(?:a |the )?recipes? (?:for|to make)\b", "make"), (r"\bregular expressions?\b", "regex"),
    (r"\btell me about\b", "explain"),
    (r"\b(?:the )?(?:best|right|correct|proper|easiest|simplest|recommended|standard) way\b", "way"),
)
_TOKEN = re.compile(r"\d+(?:\.\d+)?(?:st|nd|rd|th)?|[a-z]+")
_ROMAN = re.compile(r"^x{0,3}(?:ix|iv|v?i{0,3})$")


# ---- normalisation ----------------------------------------------------------------------------
def stem(word: str) -> str:
    """Light suffix stripping (plural, -ing, -ed, final e). Both prompts get the same treatment."""
    w = word
    if len(w) <= 3:
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith(("sses", "xes", "ches", "shes", "zes")):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")):
        w = w[:-1]
    for suffix in ("ing", "ed"):
        base = w[:-len(suffix)]
        if w.endswith(suffix) and len(base) >= 2 and re.search(r"[aeiouy]", base):
            undoubled = base[:-1] if len(base) > 3 and base[-1] == base[-2] and base[-1] not in "lsz" else base
            w = undoubled
            break
    return w[:-1] if w.endswith("e") and len(w) > 2 else w


@lru_cache(maxsize=1)
def _lexicon() -> dict[str, str]:
    """Surface form or stem -> canonical term, for synonyms, unit words and generic words."""
    table = {w: w for w in GENERIC}
    for source in (UNITS, SYNONYMS):
        table.update(source)
    stemmed = {stem(w): head for w, head in table.items()}
    return {**stemmed, **table}


def canonical(word: str) -> str:
    """Synonym table on the surface form, else on the stem; unit words map to their unit."""
    table = _lexicon()
    if word in table:
        return table[word]
    s = stem(word)
    return table.get(s, s)


def normalise_text(text: str) -> str:
    s = text.casefold().replace("\u2019", "'").replace("\u2018", "'")
    s = re.sub(r"(\d),(\d{3})\b", r"\1\2", s)
    for symbol, unit in (("$", "usd"), ("\u20ac", "eur"), ("\u00a3", "gbp")):
        s = re.sub(re.escape(symbol) + r"\s?(\d+(?:\.\d+)?)", rf"\1 {unit} ", s)
    s = s.replace("%", " percent ").replace("\u00b0c", " celsius ").replace("\u00b0f", " fahrenheit ")
    s = s.replace("c++", " cplusplus ").replace("c#", " csharp ").replace("f#", " fsharp ")
    s = re.sub(r"\bwon'?t\b", "will not", s)
    s = re.sub(r"\b(?:can't|cannot)\b", "can not", s)
    s = re.sub(r"n't\b", " not", s)
    s = re.sub(r"'(?:s|re|ve|ll|d|m)\b", "", s)
    s = re.sub(r"\b([a-z])-th\b", r"\1th", s)
    for pattern, repl in PHRASES:
        s = re.sub(pattern, repl, s)
    return s


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _roman(tok: str) -> int:
    vals = [{"i": 1, "v": 5, "x": 10}[c] for c in tok]
    return sum(-v if k + 1 < len(vals) and v < vals[k + 1] else v for k, v in enumerate(vals))


def _parse_number(tokens: list[str], i: int) -> tuple[str, str, int] | None:
    """A number starting at tokens[i] -> (value, kind, next index); kind is "ord" for ordinals."""
    tok, nxt = tokens[i], tokens[i + 1] if i + 1 < len(tokens) else ""
    if tok[0].isdigit():
        m = re.fullmatch(r"(\d+(?:\.\d+)?)(st|nd|rd|th)?", tok)
        value, j = float(m[1]), i + 1
        while not m[2] and j < len(tokens) and (tokens[j] in SCALES or tokens[j] == "k"):  # "3 million", "5k"
            value, j = value * SCALES.get(tokens[j], 1e3), j + 1
        return _fmt(value), "ord" if m[2] else "", j
    if tok in ORDINALS:
        return _fmt(ORDINALS[tok]), "ord", i + 1
    if len(tok) >= 2 and _ROMAN.match(tok):  # "World War II", "Henry VIII": ordinals
        return _fmt(_roman(tok)), "ord", i + 1
    if not (tok in NUMBER_WORDS or tok in SCALES or (tok in ("a", "an") and nxt in SCALES)):
        return None
    total, current, j = 0.0, 1.0 if tok in ("a", "an") else 0.0, i + (tok in ("a", "an"))
    while j < len(tokens):  # fold "twenty five", "two hundred thousand", "a dozen"
        t = tokens[j]
        if t in NUMBER_WORDS:
            current += NUMBER_WORDS[t]
        elif t in SCALES:
            current = (current or 1.0) * SCALES[t]
            if SCALES[t] >= 1e3:
                total, current = total + current, 0.0
        elif not (t == "and" and j + 1 < len(tokens) and tokens[j + 1] in NUMBER_WORDS):
            break
        j += 1
    return _fmt(total + current), "", j


def _parse_unit(tokens: list[str], j: int) -> tuple[str, int]:
    """The unit right after a number -> (canonical unit, next index); ("", j) when there is none."""
    tok = tokens[j] if j < len(tokens) else ""
    if tok in ("degree", "degrees"):
        after = UNITS_AFTER_NUMBER.get(tokens[j + 1], "") if j + 1 < len(tokens) else ""
        return (after, j + 2) if after in ("celsius", "fahrenheit", "kelvin") else ("degree", j + 1)
    return (UNITS_AFTER_NUMBER[tok], j + 1) if tok in UNITS_AFTER_NUMBER else ("", j)


@dataclass(frozen=True)
class Analysis:
    tokens: tuple[str, ...]  # normalised tokens
    numbers: tuple[tuple[str, str], ...]  # (value, unit or "ord" or "") in order of appearance
    negations: tuple[str, ...]  # negation cues in order
    terms: tuple[tuple[str, int], ...]  # (term, token position): canonical words, "#<number>", units


@lru_cache(maxsize=4096)
def analyse(text: str) -> Analysis:
    tokens = _TOKEN.findall(normalise_text(text))
    numbers, negations, terms = [], [], []
    i = 0
    while i < len(tokens):
        parsed = _parse_number(tokens, i)
        if parsed is not None:
            value, kind, j = parsed
            unit, j = _parse_unit(tokens, j)
            numbers.append((value, unit or kind))
            terms += [("#" + value, i)] + ([(unit, j - 1)] if unit else [])
            i = j
            continue
        tok = tokens[i]
        if tok in NEGATIONS:
            negations.append(tok)
        elif tok not in STOPWORDS and not (not terms and tok in ("list", "name")):  # imperative "List the ..."
            terms.append((canonical(tok), i))
        i += 1
    return Analysis(tuple(tokens), tuple(numbers), tuple(negations), tuple(terms))
