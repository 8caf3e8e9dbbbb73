"""The runner contract (engine/backends/contract.py) on every backend: the same checks on a torch runner (a tiny
random model, fast) and on a llama.cpp runner (the real SmolLM2 GGUF, marked real; skipped without llama-cpp-python,
a failure with SPECLENS_REQUIRE_GGUF=1). Cache length == tokens consumed after every call and every loop step,
rollback, reset, resume, and each runtime's classes against the Protocols, member by member."""
from __future__ import annotations

import ast
import dataclasses
import inspect
import textwrap
from types import SimpleNamespace

import pytest
import torch

from engine.backends import Backend, Runner, common_prefix
from engine.backends.llama_cpp import GgufModel
from engine.backends.llama_cpp_runner import LlamaCppRunner
from engine.backends.torch_runner import ModelRunner, TorchBackend
from engine.config import PROPOSER_NAMES, SamplingConfig
from engine.decode.kpolicy import AdaptiveK, FixedK
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.models.loading import runner_for
from engine.proposers import PROPOSERS
from tests.helpers.tiny import tiny_pair

SMOL = "smollm2-135m-instruct"
EDIT = "Rename the variable x to total in: x = 0\nfor v in values:\n    x += v\nprint(x)"


@pytest.fixture(scope="module", params=["torch", pytest.param("llama.cpp", marks=pytest.mark.real)])
def pair(request) -> SimpleNamespace:
    """A target, a draft and a prompt of one backend: tiny random torch models, or SmolLM2's GGUF for both roles."""
    if request.param == "torch":
        target, draft = tiny_pair(1)
        return SimpleNamespace(kind="torch", target=target, draft=draft, prompt=[7, 8, 9, 10, 7, 8, 9])
    request.getfixturevalue("llama_cpp")
    from engine.models.loading import load_model
    from engine.models.prompt import template_ids

    smol = load_model(SMOL, "gguf")
    return SimpleNamespace(kind="llama.cpp", target=smol, draft=smol,
                           prompt=template_ids(smol.tokenizer, [{"role": "user", "content": EDIT}]))


def empty_runner(loaded) -> Runner:
    """A runner that holds nothing: ``runner_for`` may hand out one that holds a pooled context's tokens."""
    runner = runner_for(loaded)
    runner.reset()
    assert runner.cache_len() == len(runner.tokens) == 0
    return runner


def test_the_backend_is_a_value_that_names_itself(pair):
    backend = pair.target.backend
    assert backend.kind == pair.kind and backend.describe().startswith(pair.kind) and backend.weight_bytes() > 0
    total = [0.0]
    runner = empty_runner(pair.target)
    with backend.forward_clock(total):
        runner.forward(pair.prompt, n_logits=1)
    timed = total[0]
    runner.forward([pair.prompt[0]], n_logits=1)  # after the block: no longer timed
    assert timed > 0 and total[0] == timed


def test_forward_feeds_and_returns_the_rows_asked_for(pair):
    runner, vocab = empty_runner(pair.target), pair.target.vocab_size
    last = runner.forward(pair.prompt, n_logits=1)
    assert last.shape == (1, vocab) and last.dtype == torch.float32
    assert last.device == torch.device(runner.logits_device)
    assert runner.cache_len() == len(runner.tokens) == len(pair.prompt) and runner.tokens == pair.prompt
    rows = runner.forward([int(last.argmax()), 11, 12], n_logits=3)  # logits only for the rows asked for
    assert rows.shape == (3, vocab)
    assert runner.forward([13, 14], n_logits=0).shape == (2, vocab)  # 0: every row
    assert runner.cache_len() == len(runner.tokens) == len(pair.prompt) + 5
    runner.synchronize()  # waits for nothing left, returns


def test_rollback_keeps_a_prefix_and_the_cache_continues_from_it(pair):
    runner = empty_runner(pair.target)
    runner.forward(pair.prompt, n_logits=1)
    rows = runner.forward([5, 11, 12], n_logits=3)
    runner.rollback(len(pair.prompt) + 1)
    assert runner.cache_len() == len(runner.tokens) == len(pair.prompt) + 1 and runner.tokens == pair.prompt + [5]
    again = runner.forward([11], n_logits=1)  # after a rollback the cache continues from the kept prefix
    assert torch.allclose(again[0], rows[1], atol=1e-3, rtol=1e-3)
    runner.rollback(len(runner.tokens) + 3)  # past the end: nothing to drop
    assert runner.cache_len() == len(runner.tokens) == len(pair.prompt) + 2
    runner.reset()
    assert runner.cache_len() == len(runner.tokens) == 0


@pytest.mark.parametrize("held", ["nothing", "a shorter prefix", "the whole context", "a longer context",
                                  "a context that parts midway"])
def test_resume_keeps_what_is_still_valid_and_feeds_the_last_token_again(pair, held):
    context = pair.prompt
    holding = {"nothing": [], "a shorter prefix": context[:3], "the whole context": context,
               "a longer context": context + [3, 4, 5], "a context that parts midway": context[:4] + [30, 31]}[held]
    runner = empty_runner(pair.target)
    if holding:
        runner.forward(holding, n_logits=1)
    expected = common_prefix(holding, context[:-1])  # never the whole context: its last token is fed again
    assert runner.reusable_prefix(context) == expected and runner.tokens == holding  # asking changes nothing
    assert runner.resume(context) == expected
    assert runner.cache_len() == len(runner.tokens) == expected and runner.tokens == context[:expected]


def test_a_trimmed_head_keeps_the_kept_tokens_logits(pair):
    """``trim_head`` is what a runtime can do: other tokens may get -inf, the kept ones keep their logits."""
    kept = [1, 2, 3, 30]
    full = empty_runner(pair.target).forward(pair.prompt, n_logits=2)
    runner = empty_runner(pair.target)
    runner.trim_head(kept)
    trimmed = runner.forward(pair.prompt, n_logits=2)
    assert trimmed.shape == full.shape and torch.allclose(trimmed[:, kept], full[:, kept], atol=1e-4, rtol=1e-4)
    others = torch.ones(full.shape[1], dtype=torch.bool)
    others[kept] = False
    assert bool(torch.isneginf(trimmed[:, others]).all()) or torch.allclose(trimmed, full, atol=1e-4, rtol=1e-4)
    runner.trim_head(None)
    runner.rollback(0)
    assert torch.allclose(runner.forward(pair.prompt, n_logits=2), full, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", PROPOSER_NAMES)
@pytest.mark.parametrize("adaptive", [False, True])
def test_the_caches_hold_exactly_the_consumed_tokens_after_every_step(pair, name, adaptive):
    """The runtime's own count of cached positions, after every step: the target holds exactly the position the
    loop continues from (the context but its last token), and a draft runner holds the context plus at most
    k - 1 drafted tokens."""
    target, made, k_max, n = empty_runner(pair.target), [], 6, 40

    def make_draft() -> Runner:
        made.append(empty_runner(pair.draft))
        return made[-1]
    policy = AdaptiveK(k_init=3, k_max=k_max) if adaptive else FixedK(k_max)
    stream = TokenStream(pair.target.tokenizer, pair.target.eos_ids, n, False)
    emitted = []
    for event in speculative_generate(target, PROPOSERS[name](make_draft), pair.prompt, stream,
                                      SamplingConfig(max_new_tokens=n, stop_on_eos=False), k_policy=policy):
        emitted += [event.token_id] if event.type == "token" else []
        if event.type == "stats":
            context = pair.prompt + emitted
            assert target.cache_len() == len(target.tokens) == len(context) - 1
            assert target.tokens == context[:-1]
            for runner in made:
                assert runner.cache_len() == len(runner.tokens)
                assert len(runner.tokens) - common_prefix(runner.tokens, context) <= k_max - 1
    assert len(emitted) == n


# -- each runtime's classes against the Protocols, member by member --------------------------------------------

def protocol_members(protocol: type) -> tuple[dict[str, inspect.Signature], set[str]]:
    """A Protocol's methods (name -> signature) and its attributes."""
    methods = {name: inspect.signature(value) for name, value in vars(protocol).items()
               if callable(value) and not name.startswith("_")}
    return methods, set(protocol.__annotations__)


def attributes(cls: type) -> set[str]:
    """What a class's instances have without a call: class attributes, dataclass fields, and every ``self.x = ...``
    of its ``__init__``."""
    found = {name for name in dir(cls) if not name.startswith("_")}
    if dataclasses.is_dataclass(cls):
        return found | {f.name for f in dataclasses.fields(cls)}
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls.__init__)))
    return found | {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and isinstance(node.ctx, ast.Store) and isinstance(node.value, ast.Name) and node.value.id == "self"}


def mismatches(cls: type, protocol: type) -> list[str]:
    """How ``cls`` departs from ``protocol``: a missing member, or a method whose parameters differ (names, kinds,
    defaults); empty when it satisfies it."""
    methods, names = protocol_members(protocol)
    found = [f"no attribute {name}" for name in sorted(names - attributes(cls))]
    for name, wanted in methods.items():
        member = getattr(cls, name, None)
        if not callable(member):
            found.append(f"no method {name}")
            continue
        have = [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]
        want = [(p.name, p.kind, p.default) for p in wanted.parameters.values()]
        if have != want:
            found.append(f"{name}{inspect.signature(member)} is not {name}{wanted}")
    return found


@pytest.mark.parametrize("cls", [ModelRunner, LlamaCppRunner])
def test_each_runner_class_satisfies_the_runner_protocol(cls):
    assert mismatches(cls, Runner) == []


@pytest.mark.parametrize("cls", [TorchBackend, GgufModel])
def test_each_backend_class_satisfies_the_backend_protocol(cls):
    assert mismatches(cls, Backend) == []


def test_the_protocol_check_finds_a_missing_member_and_a_changed_signature():
    class Partial:
        logits_device = "cpu"

        def __init__(self):
            self.tokens, self.row_widths, self.vocab_size = [], [], 48

        def forward(self, new_ids: list[int]) -> torch.Tensor:  # no n_logits
            raise NotImplementedError

    found = mismatches(Partial, Runner)
    assert "no method rollback" in found and any(f.startswith("forward") for f in found)
    assert not any("attribute" in f for f in found)
