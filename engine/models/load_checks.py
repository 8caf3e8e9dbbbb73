"""Forward costs measured on the loaded models: the table behind ``python -m bench.speed.forward`` and the
cost model's starting point, measured once when a pair loads; the identity check that runs beside it; and what a
pair measures on this machine as one value (``LoadChecks``, with the target-only speed), which PairInfo carries.
The measuring itself runs beside serving (engine/serve/measuring.py)."""
from __future__ import annotations

import statistics
import time
import weakref
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields

from engine.backends.contract import Runner
from engine.decode.identity import (CHECK_WIDTHS, LONG_POSITION, SHORT_POSITION, IdentityCheck, measure_identity,
                                    run_now)
from engine.costs.costmodel import StepCosts, fit_line

STEP_COST_CONTEXT = 16  # tokens in the KV cache before the timed forwards (a short prefill: cheap at load)
PREFILL_CHUNK = 512
# the precision's own t(n) (engine/costs/costmodel.py): flat, then steep, with bumps where a kernel changes (llama.cpp's
# tiled K-quant matmul from 8 rows); up to 64, the widest span of known text (a prediction, a repeated answer) verified
STEP_COST_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def _plain_ids(n: int) -> list[int]:
    return [(17 * i + 11) % 1000 + 100 for i in range(n)]  # ordinary tokens; wrapped to small vocabularies


def forward_costs(runner: Runner, context: int, tokens: list[int], repeats: int) -> dict[int, float]:
    """Median seconds of a forward over n new tokens after ``context`` cached tokens, for each n. The context is
    prefilled once (kept when the runner already holds it)."""
    ids = [i % runner.vocab_size for i in _plain_ids(context + max(tokens))]
    if runner.tokens != ids[:context]:
        runner.reset()
        for start in range(0, context, PREFILL_CHUNK):  # chunks: eager attention over a long context stays small
            runner.forward(ids[start:min(start + PREFILL_CHUNK, context)], n_logits=1)
        runner.forward(ids[context:context + 1], n_logits=1)  # warm-up
        runner.rollback(context)
    costs = {}
    for n in tokens:
        times = []
        for _ in range(repeats):
            runner.synchronize()
            start = time.perf_counter()
            runner.forward(ids[context:context + n], n_logits=n)
            runner.synchronize()  # the logits may stay on a device: wait for the forward to finish
            times.append(time.perf_counter() - start)
            runner.rollback(context)
        costs[n] = statistics.median(times)
    return costs


CATCH_UP_TOKENS = 16  # the draft model's catch-up is priced per token of a forward this wide
AGREE = 0.10  # two rounds of timings agree when every width's times are within 10%
NOISE_S = 0.002  # differences below this are a timer's and a scheduler's noise, not the machine's load: a tiny
                 # model's 3 ms forward moves by a millisecond on a quiet machine
MAX_ROUNDS = 4


def agreed_costs(measure, max_rounds: int = MAX_ROUNDS, agree: float = AGREE,
                 busy: Callable[[], bool] = lambda: False) -> tuple[dict[int, float], int, float]:
    """``measure()`` (seconds per width) repeated until two rounds in a row agree within ``agree`` at every width,
    at most ``max_rounds`` times; the per-width minimum of those two (noise only adds time), the rounds run, and the
    spread of the last two rounds (the largest relative difference at a width: within ``agree`` when they agreed).
    One load on a busy machine measured twice the cost of another: a single round is not a measurement.
    Once ``busy()`` says other processes took the CPUs meanwhile, two rounds are enough: the figures will be flagged
    and measured again, so more rounds would only keep a busy machine busier; the per-width minimum of the last two."""
    last = measure()
    spread = 0.0
    for rounds in range(2, max_rounds + 1):
        now = measure()
        spread = max(max(abs(now[n] - last[n]) - NOISE_S, 0.0) / min(now[n], last[n]) for n in now)
        if spread <= agree or busy():
            return {n: min(now[n], last[n]) for n in now}, rounds, spread
        last = now
    return last, max_rounds, spread


def measure_step_costs(target: Runner | Callable[[], Runner], draft: Runner | Callable[[], Runner],
                       repeats: int = 2, step: Callable = run_now,
                       busy: Callable[[], bool] = lambda: False) -> tuple[StepCosts, float]:
    """StepCosts from timed forwards, in rounds until two agree (:func:`agreed_costs`): the target at 1..16 new
    tokens (its curve), the draft at 1 (a drafted token) and at CATCH_UP_TOKENS (its catch-up, per token); and the
    larger spread of their last two rounds (a machine too busy to repeat its timings spreads them wide).

    ``step`` runs each width's timings as one piece (a server passes its model lock, so a request waits for one
    piece at most); a runner given as a callable is asked for anew in each piece (a pooled one, which a request may
    have used in between: forward_costs prefills its context again). ``busy()``: other processes took the CPUs
    meanwhile (two rounds are then enough: :func:`agreed_costs`)."""
    def timed(runner, widths: list[int]) -> dict[int, float]:
        of = runner if callable(runner) else (lambda: runner)
        return {n: step(lambda: forward_costs(of(), STEP_COST_CONTEXT, [n], repeats)[n]) for n in widths}

    verify, _, verify_spread = agreed_costs(lambda: timed(target, list(STEP_COST_TOKENS)), busy=busy)
    a, b = fit_line(list(verify), list(verify.values()))
    drafted, _, draft_spread = agreed_costs(lambda: timed(draft, [1, CATCH_UP_TOKENS]), busy=busy)
    costs = StepCosts(verify_fixed_s=a, verify_per_token_s=b, draft_per_token_s=drafted[1],
                      verify_table=tuple(sorted(verify.items())),
                      catch_up_per_token_s=drafted[CATCH_UP_TOKENS] / CATCH_UP_TOKENS)
    return costs, max(verify_spread, draft_spread)


# The identity check's prompt: a real request (a 20-line edit, as people send), tokenised as the chat sends it.
IDENTITY_PROMPT = '''Add type hints and a docstring to this function, and keep its behaviour:

def merge_intervals(intervals):
    if not intervals:
        return []
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = [list(intervals[0])]
    for start, end in intervals[1:]:
        last = merged[-1]
        if start <= last[1]:
            last[1] = max(last[1], end)
        else:
            merged.append([start, end])
    return [tuple(pair) for pair in merged]


def total_covered(intervals):
    total = 0
    for start, end in merge_intervals(intervals):
        total += end - start
    return total


if __name__ == "__main__":
    print(merge_intervals([(1, 3), (2, 6), (8, 10), (15, 18)]))
    print(total_covered([(1, 3), (2, 6), (8, 10), (15, 18)]))
'''


_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # backend -> its IdentityCheck, on this machine


def check_identity(target, step: Callable = run_now) -> IdentityCheck:
    """Whether greedy speculation is bit-for-bit ``target``'s output on this machine: measured on a runner emptied
    first (engine/decode/identity.py), for every runner and precision, one position a ``step`` (a server's model
    lock); once per loaded model (a pair switch that keeps the target does not measure it again)."""
    if target.backend in _CHECKED:
        return _CHECKED[target.backend]
    _CHECKED[target.backend] = check = _measure(target, step)
    return check


def _measure(target, step: Callable) -> IdentityCheck:
    from engine.models.loading import runner_for, runner_name
    from engine.models.prompt import template_ids

    ids = template_ids(target.tokenizer, [{"role": "user", "content": IDENTITY_PROMPT}])
    # the positions whose widest verify and the token after it fit the context (a short context skips the long one)
    positions = tuple(p for p in (SHORT_POSITION, LONG_POSITION) if p + max(CHECK_WIDTHS) + 1 <= target.context_window)
    return measure_identity(lambda: runner_for(target), ids, target.precision, positions=positions,
                            where=f"{target.device}, {target.precision}, {runner_name(target)}", step=step)


@dataclass(frozen=True)
class TargetSpeed:
    """The target-only speed as a new request meets it: greedy tokens by the reference decoder on a prompt not seen
    before, its prefill counted in the end-to-end rate, the decode rate after the first token beside it."""
    tokens_per_s: float
    decode_tokens_per_s: float
    first_token_s: float
    tokens: int
    how: str  # what was run, in words


@dataclass(frozen=True)
class LoadChecks:
    costs: StepCosts  # the verify curve and the draft's prices: the adaptive k's starting point
    identity: IdentityCheck  # is a verify row the token fed alone, here
    speed: TargetSpeed
    measured_at: str  # local time, "YYYY-MM-DD HH:MM"
    busy: str = ""  # why the timings are not to be trusted ("" = a quiet machine): used for this run, never kept
    kept: bool = False  # read back from an earlier launch on this machine (the same model files and build)

    def note(self) -> str:
        """When and how, in words: the pair line says it beside the figures."""
        if self.busy:
            return (f"measured {self.measured_at} on a busy machine ({self.busy}): these timings are used for now, "
                    "not kept, and measured again when the machine is quiet")
        if self.kept:
            return f"measured {self.measured_at} on this machine while it was quiet (kept for these model files)"
        return f"measured {self.measured_at} on this machine while it was quiet"

    def to_json(self) -> dict:
        return {name: asdict(getattr(self, name)) for name in ("costs", "identity", "speed")} | \
            {"measured_at": self.measured_at}

    @classmethod
    def from_json(cls, data: dict) -> LoadChecks:
        """The record ``to_json`` wrote, as kept figures (JSON's lists back to tuples); KeyError or TypeError for a
        record of another shape."""
        costs = _from_json(StepCosts, data["costs"])
        if tuple(n for n, _ in costs.verify_table) != STEP_COST_TOKENS:
            raise ValueError(f"verify costs kept for widths {[n for n, _ in costs.verify_table]}: measured again")
        return cls(costs=costs, identity=_from_json(IdentityCheck, data["identity"]),
                   speed=_from_json(TargetSpeed, data["speed"]), measured_at=data["measured_at"], kept=True)


def _from_json(kind: type, data: dict):
    names = {f.name for f in fields(kind)}
    if set(data) != names:
        raise TypeError(f"a {kind.__name__} record with fields {sorted(data)}")
    return kind(**{k: _tuples(v) for k, v in data.items()})


def _tuples(value):
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value
