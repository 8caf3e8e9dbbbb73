"""The paraphrase judge: Yes/No probability, what it may overrule in direct mode, its reused prompt KV cache."""
from types import SimpleNamespace

import pytest
import torch

from engine.cache.embedder import HashEmbedder
from engine.cache.judge import yes_probability
from engine.cache.semantic_cache import SemanticCache
from engine.config import CacheConfig
from tests.helpers.constants import SCOPE, SMOL


class AliasEmbedder(HashEmbedder):
    """Fake: each text in ``aliases`` embeds exactly like the text it maps to (cosine 1.0)."""

    def __init__(self, aliases: dict[str, str]):
        super().__init__(64)
        self.aliases = aliases

    def encode(self, texts):
        return super().encode([self.aliases.get(t, t) for t in texts])


class RecordingJudge:
    def __init__(self, verdict: bool):
        self.verdict, self.calls = verdict, []

    def __call__(self, a: str, b: str) -> bool:
        self.calls.append((a, b))
        return self.verdict


SYNONYMS = ("Give me tips for improving my sleep.", "How can I sleep better?")  # only the key terms differ
NUMBERS = ("List three uses of baking soda.", "List five uses of baking soda.")
SWAPPED = ("Is Java faster than Python?", "Is Python faster than Java?")


def _cache(tmp_path, *pairs):
    cache = SemanticCache(tmp_path / "c", AliasEmbedder({b: a for a, b in pairs}), config=CacheConfig("direct"))
    for a, _ in pairs:
        cache.store(a, SCOPE, "answer", [1], complete=True)
    return cache


def test_yes_probability_from_hand_made_logits():
    logits = torch.full((10,), -5.0)
    logits[[1, 2]] = torch.tensor([2.0, 2.0])  # two yes spellings
    logits[7] = 2.0 + torch.log(torch.tensor(2.0))  # one no spelling, as likely as both yes ones together
    assert yes_probability(logits, [1, 2], [7]) == pytest.approx(0.5)
    logits[7] = -30.0
    assert yes_probability(logits, [1, 2], [7]) > 0.999


def test_a_yes_from_the_judge_serves_a_hit_that_only_the_key_terms_guard_stopped(tmp_path):
    cache = _cache(tmp_path, SYNONYMS)
    assert cache.lookup(SYNONYMS[1], SCOPE).outcome == "verified"  # the guards alone
    yes, no = RecordingJudge(True), RecordingJudge(False)
    hit = cache.lookup(SYNONYMS[1], SCOPE, judge=yes)
    assert hit.outcome == "cached" and "judge" in hit.reason and yes.calls == [SYNONYMS]
    assert cache.lookup(SYNONYMS[1], SCOPE, judge=no).outcome == "verified" and no.calls == [SYNONYMS]


@pytest.mark.parametrize("pair", [NUMBERS, SWAPPED])
def test_the_judge_never_overrules_numbers_negation_or_order(tmp_path, pair):
    cache = _cache(tmp_path, pair)
    yes = RecordingJudge(True)
    assert cache.lookup(pair[1], SCOPE, judge=yes).outcome == "verified" and yes.calls == []


def test_verify_mode_never_asks_the_judge(tmp_path):
    cache = _cache(tmp_path, SYNONYMS)
    yes = RecordingJudge(True)
    assert cache.lookup(SYNONYMS[1], SCOPE, CacheConfig("verify"), judge=yes).outcome == "verified" and yes.calls == []


@pytest.mark.real
def test_the_reused_prompt_prefix_gives_the_same_probability_as_a_fresh_forward(real_models):
    from engine.cache.judge import LLMJudge

    loaded = real_models.model(SMOL, "fp32")
    warm = LLMJudge(loaded, threshold=0.5)
    first = warm.probability(*SYNONYMS)
    second = warm.probability(*NUMBERS)  # rolls back to the shared prefix, then prefills only the new pair
    assert 0.0 <= first <= 1.0 and second == pytest.approx(LLMJudge(loaded, 0.5).probability(*NUMBERS), abs=1e-4)
    assert warm.probability(*SYNONYMS) == pytest.approx(first, abs=1e-4)


def test_only_calibrated_model_and_precision_pairs_judge():
    from engine.cache.judge import YES_THRESHOLDS, judge_for, uncalibrated_note

    assert judge_for(SimpleNamespace(name="some-uncalibrated-model", precision="bf16")) is None
    assert all(0.5 <= t < 1.0 for t in YES_THRESHOLDS.values())
    (name, precision), *_ = YES_THRESHOLDS
    assert uncalibrated_note(SimpleNamespace(name=name, precision=precision)) == ""
    nf4 = SimpleNamespace(name=name, precision="nf4")  # P(yes) shifts with quantisation: not calibrated there
    assert judge_for(nf4) is None
    note = uncalibrated_note(nf4)
    assert f"{name} at nf4" in note and f"calibrated at {precision}" in note and "verified" in note


def test_direct_mode_without_a_calibrated_judge_says_why_a_near_hit_is_verified(tmp_path):
    from engine.cache.cached_chat import chat_scope, lookup
    from engine.cache.judge import uncalibrated_note
    from engine.config import CacheConfig, SamplingConfig

    target = SimpleNamespace(name="qwen2.5-coder-1.5b-instruct", precision="nf4", vocab_size=100)
    cache = SemanticCache(tmp_path / "c", AliasEmbedder({SYNONYMS[1]: SYNONYMS[0]}), config=CacheConfig("direct"))
    sampling = SamplingConfig()
    scope = chat_scope(target, sampling, [{"role": "user", "content": SYNONYMS[0]}])
    cache.store(SYNONYMS[0], scope, "answer", [1], complete=True)
    note = uncalibrated_note(target)
    ask = [{"role": "user", "content": SYNONYMS[1]}]
    hit, event, _ = lookup(cache, target, ask, sampling, CacheConfig("direct"), judge=None, judge_note=note)
    assert hit.outcome == "verified" and note in event.reason and "key terms" in event.reason
    hit, event, _ = lookup(cache, target, ask, sampling, CacheConfig("verify"), judge=None, judge_note=note)
    assert hit.outcome == "verified" and note not in event.reason  # verify mode never judges: nothing missing
