"""Tiny randomly initialised fp32 models and a byte tokenizer: the engine's tests need no weights."""
from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engine.runner import ModelRunner
from engine.models import wrap_model

VOCAB = 48


class ByteTokenizer:
    """ids 0..VOCAB-1: id 0 is EOS, others map to printable characters."""
    eos_token_id = 0
    chat_template = None

    def __len__(self):
        return VOCAB

    def get_vocab(self):
        return {chr(48 + i): i for i in range(VOCAB)}

    def __call__(self, text, add_special_tokens=False):
        """Any text -> ids 1..VOCAB-1 (so the engine's chat path works on tiny models)."""
        return {"input_ids": [1 + ord(c) % (VOCAB - 1) for c in text]}

    def decode(self, ids, skip_special_tokens=True, clean_up_tokenization_spaces=False):
        return "".join(chr(48 + i) for i in ids if not (skip_special_tokens and i == 0))


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
