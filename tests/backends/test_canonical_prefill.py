"""A pooled runner's rows and a fresh prefill's: ``identical`` answers are the target's own whatever a runner held.

On llama.cpp's x86 builds a row fed in a forward of 8 tokens or more (the tiled K-quant matmul) rounds otherwise
than the same row fed alone, and a row of a wide forward is the same in any wide forward. A fresh prefill computes
every prompt row wide; a runner that held the prompt but its last token fed that token alone, so an answer after an
earlier request on the same prompt could leave the target's own (found on the 1.5B at token 44 of a 20-line edit).
``Runner.resume(narrow=...)`` keeps only rows of the fresh prefill's kind (engine/backends/contract.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.backends.contract import canonical_prefix
from engine.config import CACHE_OFF, DEFAULT_SPEC, SamplingConfig
from engine.events import final_done
from engine.models.catalog import DEFAULT_DRAFT
from engine.models.loading import runner_for

EDITS = Path(__file__).resolve().parents[2] / "bench" / "prompts" / "edits-20-lines.jsonl"


@pytest.mark.parametrize("widths, keep, context_len, expected", [
    ([300] * 300, 300, 301, 293),  # the same prompt again: at least narrow + 1 = 8 rows are fed, wide
    ([300] * 300, 300, 400, 300),  # a longer prompt: every held row is wide, the rest is fed wide
    ([300] * 300 + [1] * 50, 350, 420, 300),  # a chat's next turn: the answer's rows (narrow) are fed again, wide
    ([5] * 5, 5, 6, 5),  # a short prompt: narrow rows, fed narrow
    ([1] * 20, 20, 30, 0),  # narrow rows where a fresh prefill computes wide ones: nothing kept
    ([300] * 300, 3, 5, 0),  # a short prompt after a long one: its rows were wide, a fresh one's are narrow
])
def test_only_rows_a_fresh_prefill_computes_the_same_are_kept(widths, keep, context_len, expected):
    assert canonical_prefix(widths, keep, context_len, narrow=7) == expected


@pytest.fixture(scope="module")
def qwen_half(real_models):
    """The 0.5B coder's Q4_K_M GGUF (a K-quant, as the default target's) as its own draft, its figures measured."""
    return real_models.engine(DEFAULT_DRAFT, "gguf", DEFAULT_DRAFT, "gguf")


def edit_messages(n: int = 3) -> tuple[list[dict], str]:
    prompt = json.loads(EDITS.read_text().splitlines()[n])["prompt"]
    return [{"role": "user", "content": prompt}], prompt.split("\n\n", 1)[1]


@pytest.mark.real
@pytest.mark.usefixtures("llama_cpp")
def test_a_pooled_runner_computes_the_prompt_as_a_fresh_prefill(qwen_half):
    """Row for row, on the real K-quant GGUF: after a runner held the prompt and an answer, resuming the same prompt
    and a chat's next turn gives the logits a fresh prefill gives. Without ``narrow`` the same prompt's last row is
    fed alone, which a measured width cap says may differ."""
    info = qwen_half.info()
    if info.identity_width_cap is None and not info.bit_identical:
        pytest.skip("no verify width is identical on this machine: the app claims no identity to keep")
    narrow = info.identity_width_cap  # None: every width identical, any resume computes the same rows
    messages, _ = edit_messages()
    prompt = qwen_half.encode(messages)
    runner = runner_for(qwen_half.target)

    def fresh(ids):
        runner.reset()
        return runner.forward(ids, n_logits=1)[-1]

    def resumed(ids):
        pos = runner.resume(ids, narrow=narrow)
        return runner.forward(ids[pos:], n_logits=1)[-1], pos

    first = fresh(prompt)
    answer = [int(first.argmax())]
    for _ in range(12):  # an answer, fed a token at a time as the reference feeds it
        answer.append(int(runner.forward(answer[-1:], n_logits=1)[-1].argmax()))
    again, kept = resumed(prompt)
    assert torch.equal(again, first) and 0 < kept < len(prompt)
    turn = prompt + answer + prompt[-20:]  # a next turn: the conversation so far, then new text
    runner.reset()
    runner.forward(prompt)
    for token in answer:
        runner.forward([token])
    after, kept = resumed(turn)
    assert torch.equal(after, fresh(turn)) and kept > 0
    runner.reset()


@pytest.mark.real
@pytest.mark.usefixtures("llama_cpp")
def test_identical_mode_gives_the_reference_with_and_without_a_prediction_after_the_same_prompt(qwen_half):
    """A 20-line edit (a 300-token prompt, answers reaching position 400), the file as a prediction, in the
    ``identical`` verify mode, each request after others filled the pool with the same prompt: the same tokens as
    target-only decoding."""
    info = qwen_half.info()
    if info.identity_width_cap is None and not info.bit_identical:
        pytest.skip("no verify width is identical on this machine: the app claims no identity to keep")
    if info.identity_width_cap is not None:
        qwen_half.set_verify_mode("identical")
    messages, file = edit_messages()
    sampling = SamplingConfig(max_new_tokens=96)
    reference = final_done(qwen_half.generate_reference(messages, sampling)).token_ids
    plain = final_done(qwen_half.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF)).token_ids
    predicted = final_done(qwen_half.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF,
                                              prediction=file)).token_ids
    again = final_done(qwen_half.generate_reference(messages, sampling)).token_ids
    assert len(reference) >= 64 and plain == reference and predicted == reference and again == reference
