"""CUDA GPUs and Apple Silicon, on a machine that has neither: device availability and properties (free memory,
bf16 support, torch's quantized engine) are monkeypatched; the choices, loader arguments and refusals are the
real code's. ``python -m pytest -k "cuda or mps"`` runs these."""
from __future__ import annotations

import sys
import types

import pytest
import torch
from transformers import BitsAndBytesConfig

from bench.speed.forward import default_precisions
from engine.errors import DeviceOutOfMemoryError, InvalidSettingError, MissingDependencyError
from engine.models import devices
from engine.models.devices import ModelSize, choose_gpu_precisions
from engine.models.auto import describe, plan_precisions
from engine.models.hardware import detect_machine
from engine.models.loading import _quantization_kwargs, default_device, load_model
from tests.helpers.tiny import tiny_model

CUDA, MPS, CPU = torch.device("cuda"), torch.device("mps"), torch.device("cpu")
GB = 10**9
QWEN_1_5B = ModelSize(params=1_543_714_304, linear_params=1_310_000_000)  # about 3.1 GB in bf16, 1.0 GB in nf4
QWEN_0_5B = ModelSize(params=494_032_768, linear_params=358_000_000)  # about 1.0 GB in bf16


@pytest.fixture
def gpu(monkeypatch):
    """A CUDA GPU with settable free memory and bf16 support; the probes are torch's own functions."""
    state = types.SimpleNamespace(free=80 * GB, total=80 * GB, bf16=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state.free, state.total))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: state.bf16)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Test GPU")
    return state


@pytest.fixture
def mac(monkeypatch):
    """Apple Silicon: MPS available, no CUDA; ``state.bf16`` is whether MPS computes in bf16 (macOS 14+)."""
    state = types.SimpleNamespace(bf16=True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    real = devices.bf16_supported
    monkeypatch.setattr(devices, "bf16_supported", lambda d: state.bf16 if d.type == "mps" else real(d))
    return state


@pytest.fixture
def tiny_source(tmp_path):
    """A local model directory (config and a word-level tokenizer) for the loader: a 2-layer Llama."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    model = tiny_model(0)
    model.save_pretrained(tmp_path)
    vocab = {f"w{i}": i for i in range(model.config.vocab_size)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="w1")),
                            eos_token="w0").save_pretrained(tmp_path)
    return str(tmp_path)


# -- which device, which machine kind --------------------------------------------------------------------------
def test_default_device_is_cuda_then_mps_then_cpu(monkeypatch, gpu):
    assert default_device().type == "cuda" and detect_machine().kind == "cuda"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert default_device().type == "mps" and detect_machine().kind == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert default_device().type == "cpu" and detect_machine().kind not in ("cuda", "mps")


def test_mps_machine_is_named_in_the_precision_note(mac):
    machine = detect_machine("mps")
    assert machine.kind == "mps" and machine.describe().startswith("Apple GPU (MPS)")
    note = describe(machine, {"target": "bf16", "draft": "bf16"}, {"target", "draft"}, ["why"])
    assert note == "Apple GPU (MPS) [mps] -> target bf16 (auto), draft bf16 (auto): why"


# -- what auto picks ----------------------------------------------------------------------------------------------
def test_mps_auto_is_bf16_for_both_never_int8_dynamic_or_nf4(mac, tiny_source):
    plan = plan_precisions({"target": (tiny_source, None), "draft": (tiny_source, None)}, MPS)
    assert plan.precisions == {"target": "bf16", "draft": "bf16"}
    assert plan.reason == ("Apple GPU (MPS) [mps] -> target bf16 (auto), draft bf16 (auto): bf16: the 16-bit "
                           "precision Apple's MPS computes in")
    mac.bf16 = False  # macOS 13: MPS has no bf16
    plan = plan_precisions({"target": (tiny_source, None), "draft": (tiny_source, "auto")}, MPS)
    assert plan.precisions == {"target": "fp16", "draft": "fp16"} and "no bf16" in plan.reason


def test_the_auto_sentence_in_launch_help_is_the_pair_lines(monkeypatch, capsys, tiny_source):
    """launch.py --help says what auto picks here for the default pair, and why: the very sentence the UI's pair
    line (PairInfo.precision_note), the bench header and /v1/models show once that pair loads."""
    import launch
    from engine.chat_engine import ChatEngine
    from engine.models import auto

    monkeypatch.setattr(auto, "DEFAULT_TARGET", tiny_source)  # a default pair that loads in a second
    monkeypatch.setattr(auto, "DEFAULT_DRAFT", tiny_source)
    with pytest.raises(SystemExit):
        launch.parse_args(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    info = ChatEngine(measure_beside=False).load_pair(tiny_source, tiny_source)  # auto for both
    assert info.precision_note.startswith(detect_machine("cpu").describe() + " -> target ")
    assert f"Here auto picks, for the default pair: {' '.join(info.precision_note.split())}" in help_text
    assert "gguf (llama.cpp on CPU" in help_text


def test_cuda_auto_is_bf16_when_the_pair_fits_free_memory_and_says_so(gpu, tiny_source):
    plan = plan_precisions({"target": (tiny_source, None), "draft": (tiny_source, None)}, CUDA)
    assert plan.precisions == {"target": "bf16", "draft": "bf16"}
    assert "fit in 70% of the 80.0 GB free on Test GPU" in plan.reason
    gpu.free = 1000  # bytes: even nf4 does not fit a tiny pair
    plan = plan_precisions({"target": (tiny_source, None), "draft": (tiny_source, None)}, CUDA)
    assert plan.precisions == {"target": "nf4", "draft": "nf4"} and "may run out of memory" in plan.reason


def test_cuda_auto_puts_the_target_in_nf4_first_then_the_draft():
    sizes = {"target": QWEN_1_5B, "draft": QWEN_0_5B}
    free = {"target": None, "draft": None}
    assert choose_gpu_precisions(80 * GB, "bf16", sizes, free).precisions == {"target": "bf16", "draft": "bf16"}
    tight = choose_gpu_precisions(4 * GB, "bf16", sizes, free)  # 4.1 GB of bf16 > 2.8 GB; 1.0 + 1.0 GB fits
    assert tight.precisions == {"target": "nf4", "draft": "bf16"}
    assert "in bf16 the weights (4.1 GB) need more than 70% of the 4.0 GB free" in tight.reason
    tiny = choose_gpu_precisions(2 * GB, "bf16", sizes, free)
    assert tiny.precisions == {"target": "nf4", "draft": "nf4"}


def test_cuda_without_bf16_gets_fp16_and_a_chosen_precision_is_kept():
    sizes = {"target": QWEN_1_5B, "draft": QWEN_0_5B}
    old_gpu = choose_gpu_precisions(16 * GB, "fp16", sizes, {"target": None, "draft": None})
    assert old_gpu.precisions == {"target": "fp16", "draft": "fp16"} and "this GPU has no bf16" in old_gpu.reason
    kept = choose_gpu_precisions(4 * GB, "bf16", sizes, {"target": "bf16", "draft": None})
    assert kept.precisions == {"target": "bf16", "draft": "nf4"}  # the user's bf16 target stays; the draft gives


def test_cuda_auto_counts_memory_the_current_pair_lets_go(gpu, tiny_source):
    gpu.free = 1000
    plan = plan_precisions({"target": (tiny_source, None), "draft": (tiny_source, None)}, CUDA,
                           reclaimable_bytes=80 * GB)
    assert plan.precisions == {"target": "bf16", "draft": "bf16"}


def test_model_size_from_the_config_alone_for_the_cuda_plan(tiny_source):
    size = devices.model_size(tiny_source)
    model = tiny_model(0)
    assert size.params == sum(p.numel() for p in model.parameters())
    assert size.linear_params == sum(m.weight.numel() for m in model.modules()
                                     if isinstance(m, torch.nn.Linear) and m is not model.lm_head)
    assert size.bytes("bf16") == 2 * size.params and size.bytes("nf4") < size.bytes("bf16")


# -- the loader's arguments -----------------------------------------------------------------------------------------
def test_cuda_loader_arguments(gpu):
    bf16 = _quantization_kwargs("bf16", torch.device("cuda", 1))
    assert bf16 == {"dtype": torch.bfloat16, "device_map": {"": 1}}  # straight onto the GPU
    nf4 = _quantization_kwargs("nf4", CUDA)
    config = nf4["quantization_config"]
    assert isinstance(config, BitsAndBytesConfig) and config.load_in_4bit and config.bnb_4bit_quant_type == "nf4"
    assert config.bnb_4bit_compute_dtype == torch.bfloat16 and nf4["device_map"] == {"": 0}
    assert _quantization_kwargs("int8", CUDA)["quantization_config"].load_in_8bit
    gpu.bf16 = False  # a GPU before Ampere computes nf4 in fp16
    assert _quantization_kwargs("nf4", CUDA)["quantization_config"].bnb_4bit_compute_dtype == torch.float16
    assert _quantization_kwargs("fp16", CUDA) == {"dtype": torch.float16, "device_map": {"": 0}}


def test_mps_loader_arguments(mac):
    assert _quantization_kwargs("bf16", MPS) == {"dtype": torch.bfloat16}  # loaded, then moved with .to(mps)
    assert _quantization_kwargs("fp16", MPS) == {"dtype": torch.float16}


# -- refusals and typed errors ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("device, precision", [(CUDA, "int8-dynamic"), (CUDA, "int8-weight"), (MPS, "int8-dynamic"),
                                               (MPS, "nf4"), (MPS, "int8")])
def test_cuda_and_mps_refuse_what_they_cannot_run_before_loading(device, precision, tiny_source):
    with pytest.raises(InvalidSettingError) as err:
        load_model(tiny_source, precision, device=device)
    assert precision in str(err.value) and ("CPU only" in str(err.value) or "MPS" in str(err.value))
    with pytest.raises(InvalidSettingError, match="CPU only"):
        devices.check_device_precision("int4", device)  # the CPU's int4 kernel
    devices.check_device_precision("int4", CPU)


def test_bitsandbytes_int8_target_is_refused_with_the_reason_on_cuda_and_cpu():
    from engine.chat_engine import ChatEngine
    from engine.models.loading import wrap_model
    from tests.helpers.tiny import ByteTokenizer, tiny_pair

    target, draft = tiny_pair(0)
    int8_target = wrap_model("tiny-target", "int8", target.model, ByteTokenizer())
    with pytest.raises(InvalidSettingError, match="outlier columns"):
        ChatEngine().use_models(int8_target, draft)
    ChatEngine().use_models(target, wrap_model("tiny-draft", "int8", draft.model, ByteTokenizer()))  # a draft may


def test_missing_bitsandbytes_is_a_typed_error_for_cuda_nf4(monkeypatch, tiny_source):
    monkeypatch.setitem(sys.modules, "bitsandbytes", None)  # as on a Mac, where pyproject does not install it
    for device in (CUDA, CPU):
        with pytest.raises(MissingDependencyError, match="pip install bitsandbytes"):
            load_model(tiny_source, "nf4", device=device)


def test_cuda_out_of_memory_while_loading_says_the_sizes_and_what_to_choose(monkeypatch, gpu, tiny_source):
    from transformers import AutoModelForCausalLM

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", out_of_memory)
    gpu.free = 3 * GB
    with pytest.raises(DeviceOutOfMemoryError) as err:
        load_model(tiny_source, "bf16", device=CUDA)
    message = str(err.value)
    assert "a CUDA GPU ran out of memory loading" in message and "in bf16" in message
    assert "3.0 GB of 80.0 GB free" in message and "Choose nf4 (about" in message


class ChatBytes:
    """The tiny pair's byte tokenizer with a chat template, so the target can judge paraphrases."""

    def __init__(self):
        from tests.helpers.tiny import ByteTokenizer
        self.bytes = ByteTokenizer()

    def __getattr__(self, name):
        return getattr(self.bytes, name)

    def __len__(self):
        return len(self.bytes)

    def __call__(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> dict:
        return self.bytes(text)

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True) -> str:
        return "\n".join(m["content"] for m in messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.bytes(text)["input_ids"]


def test_cuda_out_of_memory_is_the_same_typed_error_on_every_path_that_runs_the_models(monkeypatch, tmp_path):
    """One fault, mapped in one place (engine/serve/model_lock.py): a generation, the target-only decode, the
    exact-hit check, the paraphrase judge, a divergence's explanation, the fp32 proof, the pair doctor and an
    experiment all say what the models take, instead of a raw error on some paths."""
    from engine.cache import judge
    from engine.cache.cached_chat import chat_scope
    from engine.cache.embedder import HashEmbedder
    from engine.cache.semantic_cache import SemanticCache
    from engine.chat_engine import ChatEngine
    from engine.config import CACHE_OFF, CacheConfig, SamplingConfig, SpecConfig
    from engine.lab.grid import OWN, ExperimentGrid
    from engine.models.loading import wrap_model
    from tests.helpers.tiny import tiny_pair

    target, draft = tiny_pair(0)
    target = wrap_model("tiny-target", "fp32", target.model, ChatBytes())
    monkeypatch.setitem(judge.YES_THRESHOLDS, ("tiny-target", "fp32"), 0.5)  # the tiny target may judge
    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", HashEmbedder()))
    engine.use_models(target, draft)
    the_judge = engine.slot.judge(engine.slot.require(), engine.lock).judge
    messages, sampling, spec = [{"role": "user", "content": "abc"}], SamplingConfig(max_new_tokens=4), SpecConfig(k=2)
    assert engine.cache.store("abc", chat_scope(target, sampling, messages), "fgh", [7, 8, 9], complete=True)
    grid = ExperimentGrid(sets=(OWN,), prompts=("abc",), target="tiny-target", drafts=("tiny-draft",),
                          draft_precisions=("fp32",), target_precisions=("fp32",), ks=(2,), temperatures=(0.0,))
    paths = [("while generating", lambda: list(engine.generate(messages, sampling, spec, cache=CACHE_OFF))),
             ("while generating", lambda: list(engine.generate_reference(messages, sampling))),
             ("while checking a cached answer",
              lambda: list(engine.generate(messages, sampling, spec, cache=CacheConfig(mode="verify")))),
             ("while judging a cache hit", lambda: the_judge("abc", "abd")),
             ("while explaining a divergence", lambda: engine.explain_divergence(messages, [1, 2], [1, 3])),
             ("while proving in fp32", lambda: engine.prove_fp32(messages, sampling, spec)),
             ("while diagnosing the pair", lambda: engine.pair_doctor(("code",), 4)),
             ("while experimenting", lambda: list(engine.run_experiment(grid)))]

    def out_of_memory(*args, **kwargs):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")

    monkeypatch.setattr(target.model, "forward", out_of_memory)
    monkeypatch.setattr(target.model.get_decoder(), "forward", out_of_memory)  # the judge's trimmed head
    for what, run in paths:
        with pytest.raises(DeviceOutOfMemoryError, match=rf"{what} \(weights: tiny-target \(fp32\) 0\.0 GB"):
            run()


def test_mac_cpu_without_a_quantized_engine_picks_qnnpack_or_skips_int8_dynamic_unlike_mps(monkeypatch):
    qengine = types.SimpleNamespace(engine="none", supported_engines=["qnnpack", "none"])
    monkeypatch.setattr(torch.backends, "quantized", qengine)
    plan = plan_precisions({"draft": ("unused", None)}, CPU)
    assert plan.precisions == {"draft": "int8-dynamic"} and qengine.engine == "qnnpack" and "qnnpack" in plan.reason
    qengine.engine, qengine.supported_engines = "none", ["none"]
    plan = plan_precisions({"draft": ("unused", None)}, CPU)
    assert plan.precisions == {"draft": "bf16"} and "no int8-dynamic draft" in plan.reason
    with pytest.raises(InvalidSettingError, match="quantized engines"):
        plan_precisions({"draft": ("unused", "int8-dynamic")}, CPU)


# -- bench.speed.forward --------------------------------------------------------------------------------------------------
def test_bench_forward_defaults_per_device_cuda_mps_cpu(gpu, monkeypatch):
    assert default_precisions(default_device()) == ["bf16", "nf4"]
    gpu.bf16 = False
    assert default_precisions(CUDA) == ["fp16", "nf4"]
    assert default_precisions(CPU) == ["int8-dynamic", "int8-weight", "bf16"]
    monkeypatch.setattr(devices, "bf16_supported", lambda d: True)
    assert default_precisions(MPS) == ["bf16"]
    for device in (CUDA, MPS):  # only what the device can run
        for precision in default_precisions(device):
            devices.check_device_precision(precision, device)
