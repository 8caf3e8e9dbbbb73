"""Tiny randomly initialised fp32 models, a byte tokenizer, and the helpers the engine's tests share.

The engine's tests need no weights.
"""
from __future__ import annotations

from collections import Counter

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.config import SamplingConfig
from engine.events import DoneEvent
from engine.decode.kpolicy import KPolicy
from engine.decode.step import StepBudget
from engine.models.loading import wrap_model
from engine.decode.reference import reference_generate
from engine.backends.torch_runner import ModelRunner
from engine.decode.sampling import logits_to_probs
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream

VOCAB = 48


class ByteTokenizer:
    """ids 0..VOCAB-1: id 0 is EOS, others map to printable characters."""
    eos_token_id = 0
    chat_template = None

    def __len__(self):
        return VOCAB

    def get_vocab(self):
        return {chr(48 + i): i for i in range(VOCAB)}

    def get_added_vocab(self):
        return {}  # no control tokens: engine/models/prompt.py has no markers to cut at

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(48 + i) for i in ids if not (skip_special_tokens and i == 0))

    def __call__(self, text: str, add_special_tokens: bool = False, split_special_tokens: bool = False) -> dict:
        """Any text -> ids 1..VOCAB-1 (never EOS), so a ChatEngine can encode chat prompts."""
        return {"input_ids": [1 + ord(c) % (VOCAB - 1) for c in text]}


def tiny_model(seed: int, vocab: int = VOCAB, base=None, noise: float = 0.0) -> LlamaForCausalLM:
    """A 2-layer Llama; with ``base`` it is a noisy copy of it (a draft that agrees only partly)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.4, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).float().eval()
    if base is not None:
        with torch.no_grad():
            for p, q in zip(model.parameters(), base.parameters()):
                p.copy_(q + noise * torch.randn_like(q))
    model.generation_config.eos_token_id = 0
    return model


def tiny_pair(seed: int = 0, noise: float = 0.02):
    target = tiny_model(seed)
    draft = tiny_model(seed + 1000, base=target, noise=noise)
    tok = ByteTokenizer()
    return wrap_model("tiny-target", "fp32", target, tok), wrap_model("tiny-draft", "fp32", draft, tok)


def cached(loaded) -> ModelRunner:
    return ModelRunner(loaded.model, loaded.vocab_size)


class DraftRunners:
    """A registry ``make_draft`` (engine/proposers): a fresh runner of ``draft`` per call, all kept in ``made``."""

    def __init__(self, draft):
        self.draft, self.made = draft, []

    def __call__(self) -> ModelRunner:
        self.made.append(cached(self.draft))
        return self.made[-1]


def budget(k: int = 0, span: int | None = None) -> StepBudget:
    """A step budget as a test gives it: ``k`` model tokens, ``span`` free ones (default: ``k``)."""
    return StepBudget(k, k if span is None else span, "test")


def run(gen) -> list:
    """Every event of a generation; it must end with a DoneEvent."""
    events = list(gen)
    assert events[-1].type == "done"
    return events


def new_stream(target, sampling: SamplingConfig) -> TokenStream:
    return TokenStream(target.tokenizer, target.eos_ids, sampling.max_new_tokens, sampling.stop_on_eos)


def speculative_done(target, proposer, policy: KPolicy, prompt: list[int], sampling: SamplingConfig) -> DoneEvent:
    return run(speculative_generate(cached(target), proposer, prompt, new_stream(target, sampling), sampling,
                                    k_policy=policy))[-1]


def reference_done(target, prompt: list[int], sampling: SamplingConfig) -> DoneEvent:
    return run(reference_generate(cached(target), prompt, new_stream(target, sampling), sampling))[-1]


def sequence_distribution(generate, n: int) -> Counter:
    return Counter(tuple(generate(i).token_ids) for i in range(n))


def exact_sequence_probs(model, prompt: list[int], length: int, sampling: SamplingConfig) -> dict:
    """Enumerate every continuation of ``length`` tokens with the target's exact probability."""
    vocab = model.config.vocab_size
    seqs = torch.cartesian_prod(*[torch.arange(vocab)] * length)  # (vocab**length, length)
    ids = torch.cat([torch.tensor(prompt).expand(len(seqs), -1), seqs], dim=1)
    with torch.no_grad():
        probs = logits_to_probs(model(ids).logits[:, len(prompt) - 1:-1], sampling)  # (n, length, vocab)
    seq_p = probs.gather(-1, seqs[..., None])[..., 0].prod(-1)
    return {tuple(s.tolist()): float(p) for s, p in zip(seqs, seq_p)}


def total_variation(counts: Counter, exact: dict, n: int) -> float:
    return 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in exact.items())
