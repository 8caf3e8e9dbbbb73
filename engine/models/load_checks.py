"""Forward costs measured on the loaded models: the table behind ``python -m bench.speed.forward`` and the
cost model's starting point, measured once when a pair loads; and the identity check that runs beside it."""
from __future__ import annotations

import statistics
import time
import weakref

from engine.backends.contract import Runner
from engine.decode.identity import CHECK_WIDTHS, LONG_POSITION, SHORT_POSITION, IdentityCheck, measure_identity
from engine.costs.costmodel import StepCosts, fit_line

STEP_COST_CONTEXT = 16  # tokens in the KV cache before the timed forwards (a short prefill: cheap at load)
PREFILL_CHUNK = 512
STEP_COST_TOKENS = (1, 2, 4, 8, 16)  # the precision's own t(n): flat, then steep (engine/costs/costmodel.py)


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
MAX_ROUNDS = 4


def agreed_costs(measure, max_rounds: int = MAX_ROUNDS, agree: float = AGREE) -> tuple[dict[int, float], int]:
    """``measure()`` (seconds per width) repeated until two rounds in a row agree within ``agree`` at every width,
    at most ``max_rounds`` times; the per-width minimum of those two (noise only adds time), and the rounds run.
    One load on a busy machine measured twice the cost of another: a single round is not a measurement."""
    last = measure()
    for rounds in range(2, max_rounds + 1):
        now = measure()
        if all(abs(now[n] - last[n]) <= agree * min(now[n], last[n]) for n in now):
            return {n: min(now[n], last[n]) for n in now}, rounds
        last = now
    return last, max_rounds


def measure_step_costs(target: Runner, draft: Runner, repeats: int = 2) -> StepCosts:
    """StepCosts from timed forwards, in rounds until two agree (:func:`agreed_costs`): the target at 1..16 new
    tokens (its curve), the draft at 1 (a drafted token) and at CATCH_UP_TOKENS (its catch-up, per token)."""
    verify, _ = agreed_costs(lambda: forward_costs(target, STEP_COST_CONTEXT, list(STEP_COST_TOKENS), repeats))
    a, b = fit_line(list(verify), list(verify.values()))
    drafted, _ = agreed_costs(lambda: forward_costs(draft, STEP_COST_CONTEXT, [1, CATCH_UP_TOKENS], repeats))
    return StepCosts(verify_fixed_s=a, verify_per_token_s=b, draft_per_token_s=drafted[1],
                     verify_table=tuple(sorted(verify.items())),
                     catch_up_per_token_s=drafted[CATCH_UP_TOKENS] / CATCH_UP_TOKENS)


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


def check_identity(target) -> IdentityCheck:
    """Whether greedy speculation is bit-for-bit ``target``'s output on this machine: measured on a runner emptied
    first (engine/decode/identity.py), at load, for every runner and precision; once per loaded model (a pair
    switch that keeps the target does not measure it again)."""
    if target.backend in _CHECKED:
        return _CHECKED[target.backend]
    _CHECKED[target.backend] = check = _measure(target)
    return check


def _measure(target) -> IdentityCheck:
    from engine.models.loading import runner_for, runner_name
    from engine.models.prompt import template_ids

    ids = template_ids(target.tokenizer, [{"role": "user", "content": IDENTITY_PROMPT}])
    # the positions whose widest verify and the token after it fit the context (a short context skips the long one)
    positions = tuple(p for p in (SHORT_POSITION, LONG_POSITION) if p + max(CHECK_WIDTHS) + 1 <= target.context_window)
    return measure_identity(runner_for(target), ids, target.precision, positions=positions,
                            where=f"{target.device}, {target.precision}, {runner_name(target)}")
