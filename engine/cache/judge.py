"""A paraphrase judge for direct mode: the loaded language model is asked whether two requests need the
same answer, and its Yes/No next-token probability is compared with a calibrated threshold.

The lexical guards (engine/cache/guards.py) never serve a wrong answer but send most synonym paraphrases
("sleep better" / "improve my sleep") to verification. The judge gets the hits that only the soft guards
(key terms, word order) stopped; differing numbers or negation are never overruled. The cost is one short
prefill of the judging model per judged hit, and only in direct mode.

The cache stays model-agnostic: it receives ``judge(cached_prompt, new_prompt) -> bool``.
"""
from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass

import torch

from engine.models.loading import LoadedModel, runner_for
from engine.models.prompt import template_ids

INSTRUCTION = ("You check a cache of answers. Two user requests count as the same only if one answer would "
               "correctly and fully answer both: same task, same subject, same programming language or tool, "
               "same numbers, same direction. Wording, synonyms and word order do not matter. "
               "Reply with Yes or No.")
# Worked examples (none from the evaluation files): two of each, near-misses that differ in one detail.
EXAMPLES = (
    ("How can I lose weight quickly?", "What's the fastest way to shed some pounds?", "Yes"),
    ("How do I open a file in C?", "How do I open a file in C++?", "No"),
    ("Who painted the Mona Lisa?", "The Mona Lisa was painted by whom?", "Yes"),
    ("How do I start a Docker container?", "How do I stop a Docker container?", "No"),
)
# P(yes) above which a model's verdict serves a hit, per (model, precision): quantisation shifts P(yes), so a
# threshold holds only for the precision it was measured at. bf16: chosen from P(yes) on the pairs of
# tests/data/paraphrases.jsonl and tests/data/paraphrases_heldout2.jsonl. The CPU precisions auto picks
# (int8-weight, int4, gguf): proposed by `python -m bench.cache.calibrate` on tests/data/paraphrases_calib_cpu.jsonl
# (0.05 above the highest near-miss the judge is asked about), then measured on the held-out files
# (docs/cache.md, "Direct mode"). A (model, precision) without an entry never judges: an uncalibrated verdict
# could serve a wrong answer, so the hits it would have judged are verified by the target instead (see
# uncalibrated_note).
YES_THRESHOLDS: dict[tuple[str, str], float] = {
    ("qwen2.5-coder-1.5b-instruct", "bf16"): 0.9,
    ("qwen2.5-coder-0.5b-instruct", "bf16"): 0.7,
    ("qwen2.5-coder-1.5b-instruct", "int8-weight"): 0.85,
    ("qwen2.5-coder-1.5b-instruct", "int4"): 0.85,
    # gguf (llama.cpp): proposed 0.82 on an AVX2 CPU and 0.83 on an AVX-512 one (llama.cpp's kernels differ by
    # CPU kind, and so does P(Yes) a little): the higher holds on both
    ("qwen2.5-coder-1.5b-instruct", "gguf"): 0.83,
}


# (model, precision) measured and found unable to judge: its P(Yes) does not separate the true paraphrases from
# the near-misses of tests/data/paraphrases_calib_cpu.jsonl (bench.cache.calibrate; docs/cache.md).
CANNOT_JUDGE: dict[tuple[str, str], str] = {
    ("qwen2.5-coder-0.5b-instruct", "int8-weight"): "its P(Yes) does not separate paraphrases from near-misses "
                                                    "(both 0.50-0.76, measured)",
    ("qwen2.5-coder-0.5b-instruct", "int4"): "its P(Yes) does not separate paraphrases from near-misses "
                                             "(both 0.47-0.76, measured)",
    ("qwen2.5-coder-0.5b-instruct", "gguf"): "its P(Yes) does not separate paraphrases from near-misses "
                                             "(0.48-0.74 against 0.50-0.74, measured)",
}


def _ask(a: str, b: str) -> str:
    return f"Request 1: {a}\nRequest 2: {b}\nWould one answer correctly serve both requests? Yes or No."


def judge_messages(a: str, b: str) -> list[dict]:
    shots = [m for x, y, verdict in EXAMPLES
             for m in ({"role": "user", "content": _ask(x, y)}, {"role": "assistant", "content": verdict})]
    return [{"role": "system", "content": INSTRUCTION}, *shots, {"role": "user", "content": _ask(a, b)}]


def yes_probability(logits: torch.Tensor, yes_ids: list[int], no_ids: list[int]) -> float:
    """P(yes) among the yes/no answer tokens, from next-token logits (vocab,)."""
    both = torch.logsumexp(logits[yes_ids], 0), torch.logsumexp(logits[no_ids], 0)
    return float(torch.softmax(torch.stack(both), 0)[0])


def _answer_ids(tokenizer, words: tuple[str, ...]) -> list[int]:
    ids = {tokenizer.encode(w, add_special_tokens=False)[0] for w in words}
    return sorted(ids)


@dataclass(frozen=True)
class JudgeResult:
    p_yes: float
    same: bool


class LLMJudge:
    """``judge(a, b) -> bool`` backed by a loaded chat model. ``lock`` serialises it with generation (the engine's
    model lock, engine/serve/model_lock.py, which also turns a device fault into a typed error).

    The instruction and the worked examples are the same for every call: their KV cache stays in one
    runner, so a call only prefills the two requests (one ``rollback`` to the shared prefix per call).
    """

    def __init__(self, loaded: LoadedModel, threshold: float, lock: AbstractContextManager | None = None):
        self.loaded, self.threshold = loaded, float(threshold)
        self._lock = lock or threading.Lock()
        tok = loaded.tokenizer
        self._yes = _answer_ids(tok, ("Yes", " Yes", "yes"))
        self._no = _answer_ids(tok, ("No", " No", "no"))
        self._runner = runner_for(loaded)
        self._runner.trim_head(self._yes + self._no)  # only these logits are ever read

    def probability(self, a: str, b: str) -> float:
        ids = template_ids(self.loaded.tokenizer, judge_messages(a, b))  # the requests as text, never as markup
        with self._lock:
            keep = self._runner.resume(ids)
            logits = self._runner.forward(ids[keep:], n_logits=1)[-1]  # (vocab,)
        return yes_probability(logits, self._yes, self._no)

    def result(self, a: str, b: str) -> JudgeResult:
        p = self.probability(a, b)
        return JudgeResult(p, p >= self.threshold)

    def __call__(self, a: str, b: str) -> bool:
        return self.result(a, b).same


def calibrated_threshold(name: str, precision: str) -> float | None:
    return YES_THRESHOLDS.get((name, precision))


def judge_for(loaded: LoadedModel, lock: AbstractContextManager | None = None) -> LLMJudge | None:
    """A judge backed by ``loaded`` at the threshold calibrated for its (model, precision), or None."""
    threshold = calibrated_threshold(loaded.name, loaded.precision)
    return None if threshold is None else LLMJudge(loaded, threshold, lock)


def uncalibrated_note(loaded: LoadedModel) -> str:
    """What the user is told when ``loaded`` cannot judge ("" when it can)."""
    if calibrated_threshold(loaded.name, loaded.precision) is not None:
        return ""
    at = sorted(p for n, p in YES_THRESHOLDS if n == loaded.name)
    known = f" (calibrated at {', '.join(at)} only)" if at else ""
    why = CANNOT_JUDGE.get((loaded.name, loaded.precision))
    known += f": {why}" if why else ""
    return (f"no paraphrase-judge calibration for {loaded.name} at {loaded.precision}{known}: "
            "near-hits the guards stop are verified by the target instead")


def judge_line(loaded: LoadedModel | None, enabled: bool = True) -> str:
    """What the cache panel says about direct mode's judge for the loaded target, in words."""
    if loaded is None:
        return ""
    if not enabled:
        return "direct mode: the paraphrase judge is off; near-hits the guards stop are verified by the target"
    threshold = calibrated_threshold(loaded.name, loaded.precision)
    if threshold is None:
        return "direct mode: " + uncalibrated_note(loaded)
    return (f"direct mode: {loaded.name} at {loaded.precision} judges near-hits the guards stop "
            f"(serves at P(Yes) ≥ {threshold:.2f}, calibrated at this precision)")
