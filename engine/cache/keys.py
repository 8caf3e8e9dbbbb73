"""The keys of the semantic cache: the normalised prompt, the scope (everything else that shapes the answer),
and the entry key made of both. Pure functions; re-exported by :mod:`engine.cache.semantic_cache`."""
from __future__ import annotations

import hashlib
import json
import re
import unicodedata

from engine.config import SamplingConfig


def normalise_prompt(prompt: str) -> str:
    """Exact-tier key: NFKC, casefold, collapse whitespace, strip trailing punctuation."""
    s = re.sub(r"\s+", " ", unicodedata.normalize("NFKC", prompt).casefold()).strip()
    return re.sub(r"[\s.?!,;:\u2026]+$", "", s)


def make_scope(target: str, precision: str, sampling: SamplingConfig, system_prompt: str,
               history: list[dict]) -> str:
    """Stable hash of everything besides the prompt that shapes the answer. The draft model is not in it."""
    turns = [{"role": m.get("role"), "content": m.get("content")} for m in history or []]
    payload = {
        "target": target, "precision": precision,
        "temperature": float(sampling.temperature), "top_p": float(sampling.top_p), "top_k": int(sampling.top_k),
        "seed": sampling.seed if sampling.temperature > 0 else None,
        "system": system_prompt or "",
        "history": hashlib.sha256(json.dumps(turns, sort_keys=True, default=str).encode()).hexdigest(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:32]


def entry_key(scope: str, prompt: str) -> str:
    return hashlib.sha256(f"{scope}\n{normalise_prompt(prompt)}".encode()).hexdigest()[:32]
