"""An experiment grid: prompt sets crossed with k, temperature, proposer, draft and precisions. Pure Python.

A *cell* is one combination (prompt set, k, temperature, proposer, draft, draft precision, target precision);
it runs every prompt of its set and becomes one row of the results. The grid is validated once, here, with
sentences a user can act on; ``parse_*`` turn the UI's comma lists into its fields.
"""
from __future__ import annotations

import itertools
import shlex
from dataclasses import asdict, dataclass, fields

from engine.config import AUTO, MAX_K, PRECISIONS, SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.models.prompt import check_text
from engine.models.catalog import DEFAULT_DRAFT, DEFAULT_TARGET

ADAPTIVE = "adaptive"  # a k value: the adaptive policy (engine.decode.kpolicy.AdaptiveK), starting at 4
OWN = "own"  # the prompt set made of the user's own prompts
LAB_PROPOSERS = ("draft", "lookup", "hybrid")
MAX_CELLS = 96
MAX_PROMPTS_PER_SET = 20

PROMPT_SETS: dict[str, tuple[str, ...]] = {
    "code": ("Write a Python function is_prime(n) with a docstring.",
             "Write a Python function that returns the n-th Fibonacci number iteratively.",
             "Write a Python class Stack with push, pop and peek methods."),
    "edit": ("Rename the variable x to count and return only the code:\n\n```python\ndef tally(items):\n    x = 0\n"
             "    for item in items:\n        if item is not None:\n            x += 1\n    return x\n```",
             "Add type hints to this function and return only the code:\n\n```python\ndef scale(values, factor):\n"
             "    result = []\n    for v in values:\n        result.append(v * factor)\n    return result\n```",
             "Convert this loop to a list comprehension and return only the code:\n\n```python\nsquares = []\n"
             "for n in range(10):\n    if n % 2 == 0:\n        squares.append(n * n)\n```"),
    "prose": ("Explain in a short paragraph why the sky is blue.",
              "Write a short paragraph about the history of the bicycle.",
              "Describe a quiet morning in a small harbour town."),
    "math": ("What is 17 times 23? Show the steps.",
             "Solve for x: 3x + 7 = 22. Explain each step.",
             "A train travels 180 km in 2.5 hours. What is its average speed?"),
    "low-acceptance": ("Write a short poem about a lighthouse keeper who collects lost socks.",
                       "List twelve random, unrelated nouns, one per line.",
                       "Invent five names for a fantasy city and one odd fact about each."),
}

DOCTOR_KINDS = ("code", "prose", "low-acceptance")  # the pair doctor's default probe


def _fail(message: str) -> None:
    raise InvalidSettingError(message)


def _items(text: str, what: str) -> list[str]:
    items = [part.strip() for part in str(text or "").split(",") if part.strip()]
    if not items:
        _fail(f"{what}: enter at least one value (comma-separated)")
    return items


def parse_ks(text: str) -> tuple[int | str, ...]:
    """"2, 4, adaptive" -> (2, 4, "adaptive")."""
    values = []
    for item in _items(text, "k values"):
        if item.lower() == ADAPTIVE:
            values.append(ADAPTIVE)
        elif item.isdigit() and 1 <= int(item) <= MAX_K:
            values.append(int(item))
        else:
            _fail(f"k values: {item!r} is neither a whole number in [1, {MAX_K}] nor {ADAPTIVE!r}")
    return tuple(dict.fromkeys(values))


def parse_temperatures(text: str) -> tuple[float, ...]:
    values = []
    for item in _items(text, "temperatures"):
        try:
            values.append(float(item))
        except ValueError:
            _fail(f"temperatures: {item!r} is not a number")
    return tuple(dict.fromkeys(values))


def parse_names(text: str, what: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_items(text, what)))


def own_prompts(text: str) -> tuple[str, ...]:
    """One prompt per non-empty line."""
    return tuple(line.strip() for line in str(text or "").splitlines() if line.strip())


@dataclass(frozen=True)
class Cell:
    prompt_set: str
    k: int | str  # a draft length, or ADAPTIVE
    temperature: float
    proposer: str
    draft: str
    draft_precision: str
    target_precision: str

    @property
    def key(self) -> str:
        return (f"{self.prompt_set} · k={self.k} · T={self.temperature:g} · {self.proposer} · "
                f"{self.draft} ({self.draft_precision}) → target {self.target_precision}")

    @property
    def series(self) -> str:
        """The cell's key without k: cells that differ only in k share one curve."""
        return (f"{self.prompt_set} · T={self.temperature:g} · {self.proposer} · {self.draft} "
                f"({self.draft_precision}) → {self.target_precision}")

    def spec(self) -> SpecConfig:
        if self.k == ADAPTIVE:
            return SpecConfig(k=4, proposer=self.proposer, adaptive=True)
        return SpecConfig(k=self.k, proposer=self.proposer)


@dataclass(frozen=True)
class ExperimentGrid:
    sets: tuple[str, ...] = ("code",)
    prompts: tuple[str, ...] = ()  # the user's own prompts: the set OWN, when given
    ks: tuple[int | str, ...] = (2, 4)
    temperatures: tuple[float, ...] = (0.0,)
    proposers: tuple[str, ...] = ("draft",)
    drafts: tuple[str, ...] = (DEFAULT_DRAFT,)
    draft_precisions: tuple[str, ...] = (AUTO,)
    target_precisions: tuple[str, ...] = (AUTO,)
    target: str = DEFAULT_TARGET
    prompts_per_set: int = 2
    max_new_tokens: int = 48
    seed: int = 0  # prompt i of a set samples with seed + i

    def __post_init__(self):
        for name in ("sets", "prompts", "ks", "temperatures", "proposers", "drafts", "draft_precisions",
                     "target_precisions"):
            object.__setattr__(self, name, tuple(getattr(self, name)))  # JSON gives lists
        unknown = [s for s in self.sets if s not in PROMPT_SETS and s != OWN]
        if unknown:
            _fail(f"unknown prompt set(s) {unknown}; choose from {', '.join(PROMPT_SETS)}")
        if OWN in self.sets and not self.prompts:
            _fail("the 'own' prompt set needs at least one prompt (one per line)")
        if not self.sets and not self.prompts:
            _fail("choose at least one prompt set or type your own prompts")
        for i, prompt in enumerate(self.prompts, 1):
            check_text(prompt, f"own prompt {i}")
        for k in self.ks:
            if k != ADAPTIVE:
                SpecConfig(k=k)  # its own message for a bad k
        for t in self.temperatures:
            SamplingConfig(temperature=t)
        bad = [p for p in self.proposers if p not in LAB_PROPOSERS]
        if bad:
            _fail(f"unknown proposer(s) {bad}; choose from {', '.join(LAB_PROPOSERS)}")
        bad = [p for p in (*self.draft_precisions, *self.target_precisions) if p not in PRECISIONS]
        if bad:
            _fail(f"unknown precision(s) {bad}; choose from {', '.join(PRECISIONS)}")
        for name in ("ks", "temperatures", "proposers", "drafts", "draft_precisions", "target_precisions"):
            if not getattr(self, name):
                _fail(f"choose at least one value for {name.replace('_', ' ')}")
        SamplingConfig(max_new_tokens=self.max_new_tokens, seed=self.seed)
        if not 1 <= self.prompts_per_set <= MAX_PROMPTS_PER_SET:
            _fail(f"prompts per set must be in [1, {MAX_PROMPTS_PER_SET}], got {self.prompts_per_set!r}")
        if not self.target.strip() or not all(d.strip() for d in self.drafts):
            _fail("model names must not be empty")
        n = len(self.cells())
        if n > MAX_CELLS:
            _fail(f"the grid has {n} cells; at most {MAX_CELLS} run at once: choose fewer values")

    def all_sets(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*self.sets, *([OWN] if self.prompts else [])]))

    def set_prompts(self, prompt_set: str) -> tuple[str, ...]:
        if prompt_set == OWN:
            return self.prompts[: self.prompts_per_set]
        return PROMPT_SETS[prompt_set][: self.prompts_per_set]

    def sampling(self, temperature: float, prompt_index: int) -> SamplingConfig:
        return SamplingConfig(temperature=temperature, seed=self.seed + prompt_index,
                              max_new_tokens=self.max_new_tokens)

    def generations(self) -> tuple[int, int]:
        """(speculative, target-only) generations a run makes: each cell's prompts, and the target-only ones once
        per target precision, temperature and prompt set."""
        cells = self.cells()
        baselines = {(c.target_precision, c.temperature, c.prompt_set) for c in cells}
        return (sum(len(self.set_prompts(c.prompt_set)) for c in cells),
                sum(len(self.set_prompts(s)) for _, _, s in baselines))

    def cells(self) -> list[Cell]:
        """Ordered so that cells sharing a loaded pair run together (each model loads once per run)."""
        proposers = list(self.proposers)
        combos = itertools.product(self.target_precisions, self.drafts, self.draft_precisions, proposers,
                                   self.all_sets(), self.temperatures, self.ks)
        cells = [Cell(s, k, t, p, d, dp, tp) for tp, d, dp, p, s, t, k in combos]
        return list(dict.fromkeys(cells))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ExperimentGrid:
        known = {f.name for f in fields(cls)}
        extra = sorted(set(data) - known)
        if extra:
            _fail(f"the saved grid has unknown fields {extra}")
        return cls(**data)


def estimated_seconds(grid: ExperimentGrid, tokens_per_s: float) -> float:
    """How long the grid's generations take at ``tokens_per_s`` if each makes all its new tokens: the time at the
    target-only speed (an answer can end sooner, a speculative one can be faster or slower), model loads and
    step-cost measurements not included."""
    return sum(grid.generations()) * grid.max_new_tokens / tokens_per_s


def bench_command(grid: ExperimentGrid, cell: Cell, saved_json: str = "experiment.json") -> str:
    """The ``python -m bench.speed.modes`` line that measures this cell again (target-only and this cell's spec), reading
    the cell's prompts from the run's saved JSON."""
    k = "auto" if cell.k == ADAPTIVE else str(cell.k)
    args = ["python", "-m", "bench.speed.modes", "--prompts", saved_json, "--prompt-set", cell.prompt_set,
            "--target", grid.target, "--draft", cell.draft, "--dtype", cell.target_precision, "--draft-dtype",
            cell.draft_precision, "--modes", "target,spec", "--proposer", cell.proposer, "--k", k, "--temperature",
            f"{cell.temperature:g}", "--seed", str(grid.seed), "--max-new-tokens", str(grid.max_new_tokens)]
    return shlex.join(args)
