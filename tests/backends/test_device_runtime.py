"""What a GPU run depends on, checked on the CPU: logits stay on the model's device, every clock read waits for
the device, a pair switch gives its memory back, the fp32 proof stays off the GPU, transformers takes the
runner's ``cache=``, and scripts/gpu_smoke.py explains itself without a GPU."""
from __future__ import annotations

import gc
import re
import subprocess
import sys
import tomllib
import weakref
from importlib import metadata
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.version import Version

from engine.cache.embedder import HashEmbedder
from engine.cache.semantic_cache import SemanticCache
from engine.chat_engine import ChatEngine
from engine.config import CacheConfig, SamplingConfig, SpecConfig
from engine.backends import torch_runner as runner_module
from engine.backends.torch_runner import ModelRunner
from engine.events import final_done
from engine.models.loading import wrap_model
from tests.helpers.tiny import ByteTokenizer, tiny_model, tiny_pair

REPO = Path(__file__).resolve().parents[2]
MESSAGES = [{"role": "user", "content": "abcabc"}]


def test_decoding_never_copies_logits_to_the_host_for_cuda_or_mps(monkeypatch):
    """Only chosen ids and the p/q numbers shown cross to the host (int/float/tolist), never a logits tensor."""
    target, draft = tiny_pair(0)
    engine = ChatEngine(measure_beside=False)
    engine.use_models(target, draft)

    def no_host_copy(self, *args, **kwargs):
        raise AssertionError("a tensor was copied to the host")

    monkeypatch.setattr(torch.Tensor, "cpu", no_host_copy)
    for sampling in (SamplingConfig(max_new_tokens=12),
                     SamplingConfig(temperature=0.9, top_p=0.8, top_k=20, seed=3, max_new_tokens=12)):
        for proposer in ("draft", "hybrid"):
            assert final_done(engine.generate(MESSAGES, sampling, SpecConfig(k=3, proposer=proposer),
                                              cache=CacheConfig(mode="off"))).token_ids
        assert final_done(engine.generate_reference(MESSAGES, sampling)).token_ids


def test_synchronize_waits_for_cuda_and_mps_and_not_for_the_cpu(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append(("cuda", device)))
    monkeypatch.setattr(torch.mps, "synchronize", lambda: calls.append(("mps", None)))
    runner_module.synchronize(torch.device("cuda", 1))
    runner_module.synchronize(torch.device("mps"))
    runner_module.synchronize(torch.device("cpu"))
    assert calls == [("cuda", torch.device("cuda", 1)), ("mps", None)]
    runner = ModelRunner(tiny_model(0), 48)
    runner.device = torch.device("cuda", 1)  # the runner waits for its own model's device
    runner.synchronize()
    assert calls[-1] == ("cuda", torch.device("cuda", 1))


class _Clock:
    """Stands in for a module's ``time``: logs each clock read after the synchronize calls logged before it."""

    def __init__(self, log: list):
        self.log = log

    def perf_counter(self) -> float:
        self.log.append("clock")
        return float(len(self.log))


@pytest.mark.parametrize("module_name", ["engine.decode.clock", "engine.models.load_checks"])
def test_every_clock_read_on_cuda_waits_for_the_device_first(monkeypatch, module_name):
    """The logits stay on the device, so nothing else blocks: each timed region must synchronize explicitly, through
    the runner (``Runner.synchronize``; both decoders time their steps with engine.decode.clock's StepClock)."""
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    log: list[str] = []
    monkeypatch.setattr(ModelRunner, "synchronize", lambda self: log.append("sync"))
    monkeypatch.setattr(module, "time", _Clock(log))
    target, draft = tiny_pair(0)
    engine = ChatEngine(measure_beside=False)
    engine.use_models(target, draft)  # calibrates: the timed forwards
    final_done(engine.generate(MESSAGES, SamplingConfig(max_new_tokens=8), SpecConfig(k=3),
                               cache=CacheConfig(mode="off")))
    final_done(engine.generate_reference(MESSAGES, SamplingConfig(max_new_tokens=8)))
    assert log.count("clock") >= 2
    assert all(before == "sync" for before, now in zip(log, log[1:]) if now == "clock") and log[0] == "sync"


def _bf16_pair(seed: int, prefix: str = "tiny"):
    """A pair whose fp32 proof needs copies (the target is not fp32)."""
    target, draft = tiny_pair(seed)
    return (wrap_model(f"{prefix}-target", "bf16", target.model, ByteTokenizer()),
            wrap_model(f"{prefix}-draft", "bf16", draft.model, ByteTokenizer()))


def test_a_pair_switch_frees_the_old_pair_its_judge_and_its_fp32_copies_on_cuda_or_cpu(monkeypatch, tmp_path):
    import engine.serve.pair_slot

    loaded_on = []

    def fp32_copy(name, precision, device=None, cache_dir=None):  # stands in for reading fp32 weights from disk
        loaded_on.append(device)
        model = tiny_model(0 if name == "tiny-target" else 1000)
        return wrap_model(name, precision, model, ByteTokenizer())

    monkeypatch.setattr(engine.serve.pair_slot, "load_model", fp32_copy)
    engine = ChatEngine(cache=SemanticCache(tmp_path / "cache", HashEmbedder()), paraphrase_judge=True)
    old_target, old_draft = _bf16_pair(0)
    engine.use_models(old_target, old_draft)
    final_done(engine.generate(MESSAGES, SamplingConfig(max_new_tokens=6), SpecConfig(k=2),
                               cache=CacheConfig(mode="direct")))  # direct mode: the judge cache holds the target
    engine.prove_fp32(MESSAGES, SamplingConfig(max_new_tokens=6), SpecConfig(k=2))
    assert loaded_on == [torch.device("cpu")] * 2  # the fp32 copies never take GPU memory
    refs = [weakref.ref(m) for m in (old_target.model, old_draft.model, *[c.model for c in engine.slot.fp32_models()])]
    del old_target, old_draft
    engine.use_models(*_bf16_pair(5, "other"))  # another pair: nothing of the old one is needed
    gc.collect()
    assert [r() for r in refs] == [None] * len(refs)


def test_transformers_floor_takes_the_runners_cache_keyword():
    """Older 5.x releases swallow ``cache=`` into **kwargs (no KV reuse, wrong output); the floor in pyproject is
    the first release whose models take it (5.24.0: Qwen2 and Llama before it still name it past_key_values)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(Requirement(d) for d in deps if Requirement(d).name == "transformers").specifier
    floor = next(Version(s.version) for s in spec if s.operator == ">=")
    assert floor == Version("5.24.0") and Version(metadata.version("transformers")) in spec
    model = tiny_model(0)
    runner = ModelRunner(model, 48)
    runner.forward([5, 6, 7])
    step = runner.forward([8], n_logits=1)[-1]
    assert runner.cache_len() == 4  # the cache took all four tokens
    whole = ModelRunner(model, 48).forward([5, 6, 7, 8], n_logits=1)[-1]
    assert torch.allclose(step, whole, atol=1e-5)


def test_gpu_smoke_without_cuda_says_what_it_skipped_and_exits_0():
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke.py")], cwd=REPO,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("versions: ") and "no CUDA GPU" in lines[1]
    skipped = [line for line in lines if re.match(r"^\S.*: skipped \(no CUDA GPU\)$", line)]
    assert len(skipped) == 10, lines
