"""The llama.cpp runner (precision gguf, engine/backends/llama_cpp.py) under our loop, on real GGUF files: the same
ids as the HF tokenizer, speculation within ties of target-only decoding, what auto picks, what is refused, and a
follow-up turn that prefills only what is new. The runner contract and its invariants are checked on every backend
in tests/backends/test_runner_contract.py."""
from __future__ import annotations

import functools
import json
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch

from engine.config import SamplingConfig, SpecConfig
from engine.backends.llama_cpp_runner import LlamaCppRunner
from engine.decode.stream import TokenStream
from engine.divergence import first_divergence
from engine.errors import InvalidSettingError, NoPairError
from engine.models import loading, sources
from engine.models.auto import plan_precisions
from engine.models.loading import load_model, runner_for
from engine.models.sources import gguf_runnable
from engine.models.prompt import template_ids
from engine.proposers import PROPOSERS
from engine.decode.kpolicy import FixedK
from engine.decode.speculative import speculative_generate
from engine.decode.reference import reference_generate
from tests.helpers.constants import QWEN, SMOL
from tests.helpers.prompts import eval_prompts

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("llama_cpp")]

PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "Explain what a hash map is in two sentences.",
           "Rename the variable x to total in: x = 0\nfor v in values:\n    x += v\nprint(x)"]


@pytest.fixture(scope="module")
def smol():
    return load_model(SMOL, "gguf")


def _chat(loaded, text: str) -> list[int]:
    return template_ids(loaded.tokenizer, [{"role": "user", "content": text}])


def _stream(loaded, n: int) -> TokenStream:
    return TokenStream(loaded.tokenizer, loaded.eos_ids, n, False)


def test_a_gguf_model_loads_as_a_llama_cpp_runner(smol):
    """What the runner does is the contract's (tests/backends/test_runner_contract.py runs it on both backends)."""
    runner = runner_for(smol)
    assert isinstance(runner, LlamaCppRunner) and smol.precision == "gguf" and smol.device.type == "cpu"
    assert smol.backend.kind == "llama.cpp" and smol.model is None  # no transformers model: the weights are llama.cpp's
    assert smol.config.vocab_size >= smol.vocab_size  # the sizes, from the converted model's config


def test_a_forward_longer_than_the_context_is_refused_before_llama_cpp_sees_it(smol):
    """A context's batch holds the whole context: a forward past it would overrun the batch, so it is refused
    first, with the sizes, and the runner keeps what it held."""
    runner = runner_for(smol)
    runner.reset()
    runner.forward([11, 12], n_logits=1)
    with pytest.raises(ValueError, match=f"does not fit the {runner.n_ctx}-token context"):
        runner.forward([13] * (runner.n_ctx - 1), n_logits=1)
    assert runner.cache_len() == len(runner.tokens) == 2


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("proposer", ["draft", "lookup"])
def test_greedy_speculation_gives_the_target_only_tokens_up_to_rounding_ties(smol, prompt, proposer):
    """llama.cpp's rows inside a verify are not always the token fed alone (the load-time check measures where):
    the answers agree, or they first differ where the target's top two logits are within a rounding tie."""
    ids, sampling = _chat(smol, prompt), SamplingConfig(max_new_tokens=48)
    reference = [e.token_id for e in reference_generate(runner_for(smol), ids, _stream(smol, 48), sampling)
                 if e.type == "token"]
    made = speculative_generate(runner_for(smol), PROPOSERS[proposer](lambda: runner_for(smol)), ids,
                                _stream(smol, 48), sampling, k_policy=FixedK(4))
    spec = [e.token_id for e in made if e.type == "token"]
    divergence = first_divergence(smol, ids, reference, spec)
    assert divergence is None or divergence.within_rounding, divergence


@pytest.mark.parametrize("name", [SMOL, QWEN])
def test_llama_cpp_and_the_hf_tokenizer_give_the_same_ids_for_the_same_chat(name):
    """Both shipped families (Qwen's pair shares one tokenizer): the eval prompts alone and in a 3-turn chat,
    special tokens included. Our ids come from the HF tokenizer (text stays text: engine/models/prompt.py); the
    GGUF file's own tokenizer must read the rendered chat the same way."""
    loaded = load_model(name, "gguf")
    texts = eval_prompts()
    chats = [[{"role": "user", "content": t}] for t in texts]
    chats.append([{"role": "system", "content": "Be brief."}, {"role": "user", "content": texts[0]},
                  {"role": "assistant", "content": "def is_prime(n): ..."}, {"role": "user", "content": texts[1]}])
    for messages in chats:
        rendered = loaded.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert loaded.backend.tokenize(rendered, special=True) == template_ids(loaded.tokenizer, messages)


def test_auto_picks_gguf_on_a_cpu_for_gguf_models_and_torch_elsewhere(monkeypatch, tmp_path):
    cpu = torch.device("cpu")
    plan = plan_precisions({"target": (SMOL, None), "draft": (SMOL, "auto")}, cpu)
    assert plan.precisions == {"target": "gguf", "draft": "gguf"} and gguf_runnable(SMOL)
    monkeypatch.setattr(sources, "llama_cpp_available", lambda: False)  # the binding not installed
    plan = plan_precisions({"target": (SMOL, None), "draft": (SMOL, None)}, cpu)
    assert "gguf" not in plan.precisions.values()
    # the pair line and launch.py say that torch runs it, what that costs, and the command that installs the fast path
    assert "torch on a CPU" in plan.reason and "3x slower" in plan.reason
    assert "pip install llama-cpp-python==0.3.36" in plan.reason


def test_gguf_is_refused_where_it_cannot_run(monkeypatch):
    with pytest.raises(InvalidSettingError, match="CPU only"):
        plan_precisions({"target": (SMOL, "gguf"), "draft": (SMOL, "gguf")}, torch.device("cuda", 0))
    with pytest.raises(InvalidSettingError, match="needs a GGUF model"):
        sources.gguf_file(str(Path(sources.resolve_source(SMOL))))  # the converted HF directory: not a GGUF


def test_a_follow_up_turn_prefills_only_what_is_new(real_models, monkeypatch):
    """One runner per model, reused through the pool: turn 2 of a chat feeds the target the new turn only (turn 1
    fed the whole prompt), as llama-server's cache_prompt does."""
    engine = real_models.engine(SMOL, "gguf", SMOL, "gguf")
    engine.target.backend.forget_prompts()  # the pooled model's contexts held earlier chats (the same system prompt)
    fed: list[int] = []
    forward = LlamaCppRunner.forward

    def counting(self, new_ids, n_logits=0):
        fed.append(len(new_ids))
        return forward(self, new_ids, n_logits)
    monkeypatch.setattr(LlamaCppRunner, "forward", counting)
    sampling, spec = SamplingConfig(max_new_tokens=24), SpecConfig(proposer="lookup", k=4)
    turn1 = [{"role": "user", "content": PROMPTS[0]}]
    done = [e for e in engine.generate(turn1, sampling, spec) if e.type == "done"][-1]
    first_prefill = fed[0]
    fed.clear()
    turn2 = turn1 + [{"role": "assistant", "content": done.text}, {"role": "user", "content": "Now in C."}]
    list(engine.generate(turn2, sampling, spec))
    assert first_prefill >= len(engine.encode(turn1)) - 1
    assert fed[0] < len(engine.encode(turn2)) - len(engine.encode(turn1)) + 8  # the new turn, not the history


def test_a_gguf_target_with_a_torch_draft_works(real_models):
    """A mixed pair shares one tokenizer: it loads, speculates, and the identity check is the gguf target's."""
    engine = real_models.engine(SMOL, "gguf", SMOL, "int8-dynamic")
    info = engine.info()
    assert (info.target_precision, info.draft_precision) == ("gguf", "int8-dynamic") and "llama.cpp" in info.runner
    events = list(engine.generate([{"role": "user", "content": PROMPTS[0]}], SamplingConfig(max_new_tokens=16),
                                  SpecConfig(proposer="draft", k=3)))
    done = events[-1]
    assert done.type == "done" and len(done.token_ids) == 16 and done.stats.acceptance.proposed > 0
    assert info.identity_note.startswith(("verified bit-identical", "identical up to rounding ties"))
    # the identical/fastest choice exists exactly where the check found identity up to some width only
    assert bool(info.verify_mode) == ("for verify widths up to" in info.identity_note)
    if info.verify_mode:
        other = "fastest" if info.verify_mode == "identical" else "identical"
        assert engine.set_verify_mode(other).verify_mode == other
        assert engine.set_verify_mode(info.verify_mode).verify_mode == info.verify_mode
    else:
        with pytest.raises(InvalidSettingError, match="no identical/fastest choice"):
            engine.set_verify_mode("identical")


def test_fastest_runs_a_gguf_target_with_llama_servers_settings_and_identical_goes_back(real_models, monkeypatch):
    """Choosing fastest loads the target's file again with repacked weights (where they run here) and an f16 KV
    cache, measures them as a load does, and says so on the pair line; it answers with them. Identical goes back to
    the app's settings, on the target it had while anything still holds it. Where repacked weights crash, fastest
    keeps the weights as stored and says why."""
    from engine.backends import llama_cpp
    from engine.models import repack_probe

    # one probe for the test: a busy one is not kept, and the next call would measure again
    monkeypatch.setattr(repack_probe, "fastest_weights", functools.cache(repack_probe.fastest_weights))
    engine = real_models.engine(SMOL, "gguf", SMOL, "gguf")
    plain = engine.target
    expected, why, fault = repack_probe.fastest_weights(plain.backend.path)
    fast = engine.set_verify_mode("fastest")
    assert expected in (llama_cpp.FAST_SETTINGS, llama_cpp.FAST_AS_STORED)
    assert engine.target is not plain and engine.target.backend.settings == expected
    assert engine.draft.backend.settings == llama_cpp.GgufSettings()  # the draft runs as loaded
    assert fast.verify_mode == "fastest" and not fast.measuring and fast.target_speed.decode_tokens_per_s > 0
    assert f"repack {'on' if expected.repack else 'off'}, KV cache K f16 V f16" in fast.runner
    assert why in fast.verify_note and (fault is not None) == (why == fault)
    assert fast.identity_note.startswith(("verified bit-identical", "identical up to rounding ties"))
    done = [e for e in engine.generate([{"role": "user", "content": PROMPTS[0]}], SamplingConfig(max_new_tokens=16),
                                       SpecConfig(proposer="draft", k=3))][-1]
    assert done.type == "done" and len(done.token_ids) == 16 and done.stats.acceptance.proposed > 0
    back = engine.set_verify_mode("identical")
    assert engine.target is plain and "repack off, KV cache K f16 V bf16" in back.runner
    assert back.verify_mode in ("", "identical") and "llama-server's settings" not in back.verify_note

    planted_fault = "llama.cpp died of SIGILL (planted)"
    monkeypatch.setattr(repack_probe, "fastest_weights",
                        lambda path: (llama_cpp.FAST_AS_STORED, planted_fault, planted_fault))
    planted = engine.set_verify_mode("fastest")
    assert engine.target.backend.settings == llama_cpp.GgufSettings(cache_v="f16")
    assert "weights as stored: llama.cpp died of SIGILL (planted)" in planted.verify_note
    assert engine.set_verify_mode("identical").runner == back.runner and engine.target is plain


def test_a_loaded_pair_whose_figures_choose_fastest_goes_on_with_fastests_settings(tmp_path, monkeypatch):
    """Where the figures measured at load choose fastest (planted here: the pricing is tested in
    tests/serve/test_verify_mode.py), a pair loaded as the model panel loads it goes on with fastest's llama.cpp
    settings, measured as a load is, and a second load goes straight on from the kept figures; models handed in
    (``use_models``: a test's, a benchmark's) run as given and say so. The figures are planted quiet too: only quiet
    ones choose a mode (tests/serve/test_measuring.py), and SmolLM2's few-millisecond forwards on a 2-core CI machine,
    mid-suite, can spread past the busy bar, which would leave this test's outcome to the machine."""
    from engine.backends import llama_cpp
    from engine.chat_engine import ChatEngine
    from engine.models import repack_probe
    from engine.serve import measuring, verify_mode
    from engine.serve.verify_mode import VerifyChoice
    from tests.helpers.server import link_models

    monkeypatch.setattr(verify_mode, "choose_verify",
                        lambda identity, costs, quiet=True: VerifyChoice("fastest", 3, "planted: fastest pays"))
    monkeypatch.setattr(measuring, "busy_reason", lambda spread, others: "")
    monkeypatch.setattr(repack_probe, "fastest_weights", functools.cache(repack_probe.fastest_weights))
    cache_dir = tmp_path / "cache"
    cache_dir.mkdir()
    link_models(cache_dir)
    engine = ChatEngine(cache_dir=cache_dir, measure_beside=False)
    info = engine.load_pair(SMOL, SMOL, "gguf", "gguf")
    expected, why, _ = repack_probe.fastest_weights(engine.target.backend.path)
    assert engine.target.backend.settings == expected and engine.draft.backend.settings == llama_cpp.GgufSettings()
    assert info.verify_mode == "fastest" and not info.measuring and "V f16" in info.runner
    assert why in info.verify_note
    done = [e for e in engine.generate([{"role": "user", "content": PROMPTS[1]}], SamplingConfig(max_new_tokens=12),
                                       SpecConfig(proposer="draft", k=3))][-1]
    assert done.type == "done" and len(done.token_ids) == 12
    again = ChatEngine(cache_dir=cache_dir, measure_beside=False)
    assert "kept for these model files" in again.load_pair(SMOL, SMOL, "gguf", "gguf").checks_note
    assert again.target.backend.settings == expected
    served = ChatEngine(cache_dir=cache_dir)  # as launch.py's: it serves at once, and switches on a thread
    assert served.load_pair(SMOL, SMOL, "gguf", "gguf").measuring  # no claim until fastest's settings run
    settled = served.wait_measured(timeout=60)  # what launch.py waits for to print the figures: the switch too
    assert not settled.measuring and "kept for these model files" in settled.checks_note
    assert served.target.backend.settings == expected and settled.verify_mode == "fastest"
    handed = ChatEngine(cache_dir=cache_dir, measure_beside=False)
    handed.use_models(loading.load_model(SMOL, "gguf", cache_dir=cache_dir), again.draft)
    assert handed.target.backend.settings == llama_cpp.GgufSettings()
    assert "the app's llama.cpp settings, not fastest's" in handed.info().verify_note


def test_repacked_weights_are_read_from_the_file_not_mapped():
    """Repacked weights are copies made at load: a mapped file would stay resident beside them (the 1.5B: 1.1 GB more
    than llama-server held after the same answers, docs/bench.md), so llama.cpp reads the file where they are used and
    maps it where it runs the stored weights. Each load in a child process, so no other model's mapping counts."""
    import os
    import subprocess
    import sys
    from engine.models.sources import gguf_file

    path = os.path.realpath(gguf_file(SMOL))
    mapped = {repack: subprocess.run([sys.executable, "-m", "tests.helpers.mapped_after_load", path, repack],
                                     capture_output=True, text=True, check=True).stdout.strip()
              for repack in ("off", "on")}
    assert mapped == {"off": "True", "on": "False"}


def test_the_identity_bench_measures_each_llama_cpp_setting(tmp_path, capsys):
    from bench.speed.identity import GGUF_SETTINGS, main, setting_label
    out = tmp_path / "identity.json"
    main(["--model", SMOL, "--precision", "gguf", "--widths", "2-4", "--positions", "8,40", "--cost-contexts", "8,300",
          "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [r["setting"] for r in rows] == [setting_label(s) for s in GGUF_SETTINGS]
    assert rows[0]["setting"] == "flash on, repack off, K f16 V bf16"  # the app's default first
    for r in rows:
        if "skipped" in r:  # where repacked weights crash llama.cpp (repack_fault, tested below)
            assert "repack on" in r["setting"] and "with repacked weights" in r["skipped"]
            continue
        assert r["rows"] == 2 * (3 + 4 + 5) and 0 <= r["rows_equal"] <= r["rows"] and r["single_token_ms"] > 0
        assert r["identical"] == (r["rows_equal"] == r["rows"]) and (r["identical"] or r["unequal_widths"])
        assert sum(equal for equal, _ in r["equal_by_position"].values()) == r["rows_equal"]
        assert set(r["t_n"]) == {"2", "4", "8"} and all(t > 0 for t in r["t_n"].values())
        # each cost context timed on its own; the main table's figures are the first context's
        assert set(r["costs_by_context"]) == {"8", "300"} and r["costs_by_context"]["8"]["t_n"] == r["t_n"]
        assert all(c["single_token_ms"] > 0 and set(c["t_n"]) == {"2", "4", "8"} for c in r["costs_by_context"].values())
    printed = capsys.readouterr().out
    assert "flash off, repack off, K f16 V f16" in printed and "rows equal" in printed and "t(8)" in printed
    assert "costs after 8 cached tokens" in printed and "costs after 300 cached tokens" in printed


def test_where_repacked_weights_run_is_probed_apart_and_the_bench_skips_them_where_they_crash(tmp_path, monkeypatch,
                                                                                              capsys):
    """On a 2-core AMX VM llama.cpp's AMX GEMM (repacked weights) died of SIGILL at its first forward, taking the
    process: repack_fault tries them in a child process. Where it finds no fault, the same load and forwards run here;
    where it finds one, it names the signal. The identity bench then skips the repacked settings, saying why."""
    from bench.speed.identity import main
    from engine.backends import llama_cpp
    from engine.models.sources import gguf_file

    fault = llama_cpp.repack_fault(gguf_file(SMOL))
    if fault is None:
        gguf = llama_cpp.GgufModel(gguf_file(SMOL), llama_cpp.GgufSettings(repack=True, n_ctx=64))
        runner = gguf.runner(gguf.n_vocab)
        assert runner.forward(list(range(1, 9))).shape[0] == 8 and runner.forward([9]).shape[0] == 1
    else:
        assert "died of SIG" in fault and "with repacked weights" in fault, fault
    monkeypatch.setattr(llama_cpp, "repack_fault", lambda path: "llama.cpp died of SIGILL (planted)")
    out = tmp_path / "identity.json"
    main(["--model", SMOL, "--precision", "gguf", "--widths", "2", "--positions", "8", "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    skipped = [r["setting"] for r in rows if "skipped" in r]
    assert skipped and all("repack on" in s for s in skipped) and len(rows) - len(skipped) >= 4
    assert "skipped: llama.cpp died of SIGILL (planted)" in capsys.readouterr().out


def test_llama_cpps_measured_drift_stays_within_its_tie_bound(smol):
    """Where llama.cpp's verify rows are not the tokens fed alone, the drift the load-time check measures must stay
    within the tie rule that explains divergences (the record's tie_steps, engine/precision.py): else a tie would
    be called a bug, or a bug a tie."""
    from engine.models.load_checks import check_identity
    from engine.precision import precision
    check = check_identity(smol)
    assert check.rows > 0 and check.max_drift_steps <= precision("gguf").tie_steps, check.describe()


def test_forgetting_the_pools_prompts_gives_the_next_runner_an_empty_context(smol):
    """bench.speed.modes empties the pooled contexts before each timed run: the next runner starts as a new
    request does, with nothing in its KV cache, not resuming a prompt another mode prefilled."""
    import gc

    from bench.speed.modes import forget_prompts

    runner = runner_for(smol)
    runner.forward([100, 101, 102, 103], n_logits=1)
    del runner
    gc.collect()
    resumed = runner_for(smol, [100, 101, 102, 103])
    assert resumed.tokens == [100, 101, 102, 103] and resumed.cache_len() == 4  # the pool kept the prompt
    del resumed
    gc.collect()
    smol.backend.forget_prompts()
    fresh = runner_for(smol, [100, 101, 102, 103])
    assert fresh.tokens == [] and fresh.cache_len() == 0
    del fresh
    gc.collect()

    class NoPair:  # an engine with no pair loaded: its models are asked for and there are none
        @property
        def target(self):
            raise NoPairError("no pair is loaded")

        draft = target

        def memory_clear(self):
            pass

    forget_prompts(NoPair())  # no pair: nothing to forget, no error


class _PinnedFreeSpans(FixedK):
    """A k policy whose free drafts are never cut (``span`` tokens each): what is drafted depends on what the test
    gives, not on step costs timed on this machine's CPU."""

    def __init__(self, span: int):
        super().__init__(0, span=span)

    def _price(self, evidence: str, most: int) -> int | None:
        return None


def test_a_prediction_drafts_on_llama_cpp_and_the_answer_stays_the_targets(real_models):
    """What the app does on llama.cpp (the default spec, the load-time width cap) with a client's prediction: the
    answer of an edited prediction is the target-only answer, rounding ties aside, and the prediction's tokens are
    counted apart. Which spans the default spec drafts depends on the step costs timed on this CPU, so this asserts
    only what holds whatever they are (the next test pins the spans)."""
    from engine.config import DEFAULT_SPEC

    engine = real_models.engine(SMOL, "gguf", SMOL, "gguf")
    messages, sampling = [{"role": "user", "content": PROMPTS[0]}], SamplingConfig(max_new_tokens=40)
    reference = [e for e in engine.generate_reference(messages, sampling) if e.type == "done"][-1]
    words = reference.text.split(" ")
    edited = " ".join(words[:4] + ["banana"] + words[5:])
    done = [e for e in engine.generate(messages, sampling, DEFAULT_SPEC, prediction=edited) if e.type == "done"][-1]
    divergence = engine.explain_divergence(messages, list(reference.token_ids), list(done.token_ids))
    assert divergence is None or divergence.within_rounding, divergence
    predicted = done.stats.of_source("prediction")
    assert 0 <= predicted.accepted <= predicted.proposed


def test_a_prediction_verified_on_llama_cpp_keeps_its_right_tokens_and_replaces_the_edited_one(smol):
    """The loop on the llama.cpp runner with the prediction's spans pinned (8 tokens, never cut): an edited
    prediction's right tokens are accepted, the edited one is rejected and replaced by the target's, and the answer
    is the target-only answer (rounding ties aside)."""
    from engine.proposers.prediction import PredictionProposer

    prompt, n = _chat(smol, PROMPTS[0]), 40
    sampling = SamplingConfig(max_new_tokens=n, stop_on_eos=False)
    reference = [e for e in reference_generate(runner_for(smol), prompt, _stream(smol, n), sampling)
                 if e.type == "done"][-1]
    edited = list(reference.token_ids)
    edited[5] = (edited[5] + 1) % smol.vocab_size  # one token the target will not give
    proposer = PredictionProposer(edited, fallback=PROPOSERS["lookup"](lambda: runner_for(smol)))
    done = [e for e in speculative_generate(runner_for(smol), proposer, prompt, _stream(smol, n), sampling,
                                            k_policy=_PinnedFreeSpans(8)) if e.type == "done"][-1]
    divergence = first_divergence(smol, prompt, list(reference.token_ids), list(done.token_ids))
    assert divergence is None or divergence.within_rounding, divergence
    predicted = done.stats.of_source("prediction")
    assert predicted.accepted > 0 and predicted.proposed > predicted.accepted


def test_the_pool_keeps_a_bounded_number_of_idle_contexts_and_frees_the_rest(smol):
    """Four answers at once make four contexts; once let go, all but ``max_idle`` are freed (oldest first) and the
    newest keep their prompts for a follow-up turn; a later runner reuses one, and makes no new one."""
    import gc

    backend = smol.backend
    runners = [runner_for(smol, [100 + i, 200, 300]) for i in range(4)]
    for i, runner in enumerate(runners):
        runner.resume([100 + i, 200, 300])
        runner.forward([100 + i, 200, 300][len(runner.tokens):], n_logits=1)
    freed = []
    free = backend.lib.llama_free
    backend.lib.llama_free = lambda ctx: freed.append(ctx) or free(ctx)
    try:
        del runner
        while runners:  # let go in order: the fourth is released last
            runners.pop(0)
            gc.collect()
        assert backend.idle_contexts == backend.settings.max_idle == 2
        assert len(freed) >= 2  # the rest were freed
        kept = [tokens for _, _, tokens, _ in backend._idle]
        assert [t[0] for t in kept] == [102, 103] and all(len(t) == 3 for t in kept)  # the last released, whole
        again = runner_for(smol, [103, 200, 300, 400])
        assert backend.idle_contexts == 1 and again.tokens[0] == 103  # reused, with its prompt
    finally:
        backend.lib.llama_free = free


def test_a_runner_takes_the_idle_context_its_prompt_goes_on_from(smol):
    """As llama-server keeps slots: a chat's next turn resumes its own conversation though a script's request ran
    in between (it got a context of its own while there was room) and was let go of later; a runner that empties its
    context (a measurement) takes the least recently let go of when there is no room, and once let go of, its context
    is the first reused or freed, so neither conversation loses its place."""
    import gc

    backend = smol.backend
    with backend._lock:  # none waits: this test counts the contexts it makes
        dropped, backend._idle[:] = backend._idle[:], []
    for ctx, batch, *_ in dropped:
        backend.lib.llama_batch_free(batch)
        backend.lib.llama_free(ctx)
    chat = runner_for(smol, [100, 200, 300, 400])
    chat.forward([100, 200, 300, 400], n_logits=1)
    del chat
    gc.collect()
    script = runner_for(smol, [100, 900, 901])  # shares one token of the chat's four: a context of its own
    assert script.tokens == [] and backend.idle_contexts == 1
    script.forward([100, 900, 901], n_logits=1)
    del script  # let go of last
    gc.collect()
    turn = runner_for(smol, [100, 200, 300, 400, 500, 600])
    assert turn.tokens == [100, 200, 300, 400]  # the chat's own context, not the script's newer one
    assert turn.resume([100, 200, 300, 400, 500, 600]) == 4
    turn.forward([500, 600], n_logits=1)
    del turn
    gc.collect()
    measuring = runner_for(smol)  # no room: the least recently let go of (the script's)
    assert measuring.tokens == [100, 900, 901]
    measuring.reset()
    measuring.forward([7, 8, 9], n_logits=1)
    del measuring
    gc.collect()
    assert [t[0] for _, _, t, _ in backend._idle] == [7, 100]  # the emptied context first in line
    again = runner_for(smol, [100, 200, 300, 400, 500, 600, 700])
    assert again.tokens == [100, 200, 300, 400, 500, 600]
    del again
    gc.collect()


def test_an_unrelated_prompt_takes_the_context_it_costs_least_to_reuse_not_the_long_conversation(smol):
    """No room, nothing to go on from: a prompt that shares only its opening (the chat template's system turn) with a
    long conversation and a short one takes the short one, though the conversation was let go of last, and the
    conversation's next turn finds it whole (the serving bench's re-measure cut the chat's context this way, and the
    chat's next turn prefilled the whole conversation again)."""
    import gc

    backend = smol.backend
    with backend._lock:
        dropped, backend._idle[:] = backend._idle[:], []
    for ctx, batch, *_ in dropped:
        backend.lib.llama_batch_free(batch)
        backend.lib.llama_free(ctx)
    opening, conversation = [100, 101, 102], list(range(200, 240))
    short = runner_for(smol, [*opening, 900])
    short.forward([*opening, 900], n_logits=1)
    chat = runner_for(smol, [*opening, *conversation])
    chat.forward([*opening, *conversation], n_logits=1)
    del short
    gc.collect()
    del chat  # the conversation is let go of last
    gc.collect()
    assert backend.idle_contexts == backend.settings.max_idle == 2
    measuring = runner_for(smol, [*opening, 800, 801])
    assert measuring.tokens == [*opening, 900]  # the short one: 3 shared, 1 lost; the chat's would lose 40
    del measuring
    gc.collect()
    emptying = runner_for(smol)  # no prompt: the context holding least
    assert len(emptying.tokens) == 4 and emptying.tokens[:3] == opening
    del emptying
    gc.collect()
    turn = runner_for(smol, [*opening, *conversation, 300])
    assert turn.tokens == [*opening, *conversation]
    del turn
    gc.collect()


def test_a_request_goes_on_from_its_own_conversation_not_a_longer_match_it_would_cut(smol):
    """Two conversations that began alike: a script's history with another message after it (its primer), and a
    chat that answered the very message the script now sends. The script's request shares more tokens with the
    chat's context, but taking it would cut the chat's answer; it goes on from its own."""
    import gc

    backend = smol.backend
    history, answer = list(range(100, 120)), list(range(300, 310))
    own = runner_for(smol, [*history, 50])
    own.resume([*history, 50])
    own.forward([*history, 50][len(own.tokens):], n_logits=1)
    chat = runner_for(smol, [*history, 60, 61])
    chat.resume([*history, 60, 61, *answer])
    chat.forward([*history, 60, 61, *answer][len(chat.tokens):], n_logits=1)
    del own, chat
    gc.collect()
    request = runner_for(smol, [*history, 60, 61])  # shares 22 of the chat's 32, 20 of its own 21
    assert request.tokens == [*history, 50]
    del request
    gc.collect()
