"""Names the tests share: the built-in models they load by name, and the semantic cache's test scope."""
from __future__ import annotations

from engine.cache.keys import make_scope
from engine.config import SamplingConfig

SMOL = "smollm2-135m-instruct"  # the smallest built-in model: most real-model tests load it, as target and draft
QWEN = "qwen2.5-coder-1.5b-instruct"  # the real tests' larger target (a 1.5B coder)

SCOPE = make_scope("qwen-1.5b", "bf16", SamplingConfig(), "You are helpful.", [])  # one chat's cache scope
