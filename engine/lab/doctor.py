"""The pair doctor: before any run, can these two models pair, what do they cost here, what speedup to expect.

It checks the vocabulary and the chat template, estimates the weights' memory per precision (from the
parameter count; the KV cache comes on top), times one draft token and target forwards over n tokens, solves
the cost model for the break-even acceptance of each k, and probes acceptance on a few prompts per kind.
"""
from __future__ import annotations

import threading

from engine.config import SamplingConfig
from engine.lab.grid import PROMPT_SETS, Cell
from engine.lab.results import DoctorReport
from engine.lab.experiment import run_speculative
from engine.models.load_checks import forward_costs
from engine.models.devices import config_size
from engine.models.loading import LoadedModel, runner_for
from engine.models.prompt import encode_chat
from engine.costs.costmodel import StepCosts, break_even_alpha, fit_line
from engine.events import Acceptance
from engine.precision import RECORDS

VERIFY_TOKENS = (1, 2, 4, 8, 16)
DOCTOR_KS = tuple(range(1, 9))
PROBE_PROMPTS = 3
TEMPLATE_PROBE = [{"role": "user", "content": "Hi"}]


def memory_gb(loaded: LoadedModel) -> dict[str, float]:
    """Weights only, per precision (each record's bytes per weight; the KV cache comes on top)."""
    size = config_size(loaded.config)
    return {name: size.bytes(name) / 1e9 for name in RECORDS}


def kv_mb_per_1k(loaded: LoadedModel) -> float:
    c = loaded.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    return 2 * c.num_hidden_layers * kv_heads * head_dim * 2 * 1000 / 1e6  # K and V, bf16


def template_check(target: LoadedModel, draft: LoadedModel) -> tuple[bool, str]:
    def render(tokenizer) -> str | None:
        if not getattr(tokenizer, "chat_template", None):
            return None
        return tokenizer.apply_chat_template(TEMPLATE_PROBE, tokenize=False, add_generation_prompt=True)

    t, d = render(target.tokenizer), render(draft.tokenizer)
    if t == d:
        return True, "same chat template" if t is not None else "neither has a chat template (plain role: text)"
    return False, ("the chat templates differ: the draft reads the target's prompt, a format it was not tuned on, "
                   "so expect lower acceptance")


def measure_costs(target: LoadedModel, draft: LoadedModel) -> tuple[float, dict[int, float], StepCosts]:
    verify = forward_costs(runner_for(target), 32, list(VERIFY_TOKENS), repeats=3)
    t_draft = forward_costs(runner_for(draft), 32, [1], repeats=3)[1]
    a, b = fit_line(list(verify), list(verify.values()))
    return t_draft, verify, StepCosts(verify_fixed_s=a, verify_per_token_s=b, draft_per_token_s=t_draft)


def probe(target: LoadedModel, draft: LoadedModel, costs: StepCosts, kind: str, tokens: int,
          cancel: threading.Event | None) -> dict:
    """Greedy acceptance of the draft (k = 4) on the kind's first prompts, and the cost model's speedup per k."""
    cell = Cell(kind, 4, 0.0, "draft", draft.name, draft.precision, target.precision)
    acceptance = Acceptance()
    for prompt in PROMPT_SETS[kind][:PROBE_PROMPTS]:
        ids = encode_chat(target.tokenizer, [{"role": "user", "content": prompt}], target.context_window)
        run = run_speculative(target, draft, costs, cell, ids, SamplingConfig(max_new_tokens=tokens), cancel)
        acceptance += run.acceptance
    alpha = acceptance.alpha
    predicted = {k: costs.speedup(alpha, k) for k in DOCTOR_KS}
    best = costs.best_k(alpha, list(DOCTOR_KS))
    return {"alpha": alpha, "prompts": PROBE_PROMPTS, "tokens": tokens, "best_k": best, "predicted": predicted}


def diagnose(target: LoadedModel, draft: LoadedModel, kinds: tuple[str, ...], probe_tokens: int,
             cancel: threading.Event | None = None) -> DoctorReport:
    same_template, note = template_check(target, draft)
    t_draft, verify, costs = measure_costs(target, draft)
    probes = {}
    for kind in kinds:
        if cancel is not None and cancel.is_set():
            break
        probes[kind] = probe(target, draft, costs, kind, probe_tokens, cancel)
    t_mem, d_mem = memory_gb(target), memory_gb(draft)
    return DoctorReport(
        target=target.name, draft=draft.name, target_precision=target.precision, draft_precision=draft.precision,
        vocab_same=target.tokenizer.get_vocab() == draft.tokenizer.get_vocab(),
        vocab_sizes=(target.vocab_size, draft.vocab_size), template_same=same_template, template_note=note,
        memory_gb={p: {"target": t_mem[p], "draft": d_mem[p]} for p in t_mem},
        kv_mb_per_1k_tokens={"target": kv_mb_per_1k(target), "draft": kv_mb_per_1k(draft)},
        t_draft_s=t_draft, t_verify_s=verify, costs=costs,
        break_even={k: break_even_alpha(costs, k) for k in DOCTOR_KS}, probes=probes)
