"""The bench's prompts (bench/prompts/), for tests that want the text users send rather than made-up strings."""
from __future__ import annotations

import json
from pathlib import Path

EVAL = Path(__file__).resolve().parents[2] / "bench" / "prompts" / "eval.jsonl"  # code, edit, math and prose


def eval_prompts() -> list[str]:
    return [json.loads(line)["prompt"] for line in EVAL.read_text(encoding="utf-8").splitlines() if line.strip()]
