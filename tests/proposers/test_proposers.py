"""Every proposer keeps the loop lossless: greedy equality and the sampling distribution (tiny fp32 models)."""
import random

import pytest
import torch

import engine.proposers
from engine.config import DEFAULT_SPEC, FREE_PROPOSERS, PROPOSER_NAMES, SamplingConfig, SpecConfig
from engine.decode.draft import EMPTY_DRAFT, Draft
from engine.events import final_done
from engine.decode.kpolicy import AdaptiveK, FixedK
from engine.models.loading import wrap_model
from engine.proposers import (CONFIDENCE_CUTOFF, HEAD_TOKENS, PROPOSERS, DraftModelProposer, HybridProposer,
                              NgramProposer)
from engine.proposers.cached_answer import CachedAnswerProposer
from engine.proposers.ngram import FOLLOWING_MATCH, ngram_match
from engine.start.decoders import start_speculative
from tests.helpers.tiny import (ByteTokenizer, DraftRunners, budget, cached, exact_sequence_probs, reference_done,
                        sequence_distribution, speculative_done, tiny_model, tiny_pair, total_variation)


def test_ngram_lookup_continues_the_latest_longest_match():
    context = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert ngram_match(context, 2)[0] == [7, 8]  # latest earlier "1 2 3" is followed by 7 8
    assert ngram_match([4, 5, 6], 3)[0] == []
    assert ngram_match([1, 2, 3, 4], 3, source=[0, 3, 4, 5, 6, 7])[0] == [5, 6, 7]


def brute_force_lookup(context, k, max_ngram=4, min_ngram=2, source=None):
    """The definition, searched directly: longest n first, then the latest occurrence with a token after it."""
    own = source is None
    source = context if own else source
    for n in range(min(max_ngram, len(context) - 1), min_ngram - 1, -1):
        pattern = context[-n:]
        last_start = len(source) - n - 1 if own else len(source) - n
        for start in range(last_start, -1, -1):
            if source[start:start + n] == pattern and source[start + n:start + n + k]:
                return source[start + n:start + n + k]
    return []


def test_a_lookup_match_of_eight_tokens_is_evidence_that_the_answer_copies():
    """The match's length is the lookup's evidence (free_drafts' FreeDrafts prices each class): a suffix found again
    FOLLOWING_MATCH tokens long is priced as following, a shorter one by its length."""
    text = list(range(100, 120))
    long = NgramProposer().propose(text + [1] + text[:FOLLOWING_MATCH], budget(span=4))
    assert long.tokens == text[FOLLOWING_MATCH:FOLLOWING_MATCH + 4] and long.evidence_class == "lookup/following"
    short = NgramProposer(min_ngram=3).propose(text + [1] + text[:3], budget(span=4))
    assert short.tokens == text[3:7] and short.evidence_class == "lookup/match-3"


@pytest.mark.parametrize("context, k, ngrams, source, expected", [
    ([], 3, (4, 2), None, []),  # empty
    ([1], 3, (4, 1), None, []),  # too short: the suffix n-gram is never the whole context
    ([1, 2], 3, (4, 2), None, []),  # too short for a 2-gram with something before it
    ([1, 2, 3, 4, 5], 3, (4, 2), None, []),  # no match
    ([1, 2, 3, 9, 1, 2], 3, (4, 2), None, [3, 9, 1]),  # match at the very start
    ([1, 2, 3, 9, 1, 2], 0, (4, 2), None, []),  # k = 0
    ([7, 7, 7, 7, 7], 3, (4, 2), None, [7]),  # overlapping matches: the 4-gram at 0 leaves one token
    ([1, 2, 1, 2, 1, 2], 4, (3, 2), None, [1, 2]),  # overlapping: "2 1 2" latest at 1
    ([5, 1, 2, 6, 1, 2, 7, 1, 2], 2, (4, 2), None, [7, 1]),  # latest of equal length
    ([3, 1, 2, 6, 9, 1, 2, 8, 3, 1, 2], 2, (4, 2), None, [6, 9]),  # longer beats later
    ([1, 2, 3], 2, (4, 2), [9, 2, 3], []),  # the only match ends the source: nothing to propose
    ([1, 2, 3], 2, (4, 2), [2, 3, 5, 2, 3], [5, 2]),  # so an earlier one counts
    ([1, 2, 3], 2, (4, 2), [], []),  # empty source
    ([8, 2, 3], 2, (4, 2), [2, 3, 4], [4]),  # source match at its very start
])
def test_ngram_lookup_edge_cases(context, k, ngrams, source, expected):
    max_ngram, min_ngram = ngrams
    assert ngram_match(context, k, max_ngram, min_ngram, source)[0] == expected
    assert brute_force_lookup(context, k, max_ngram, min_ngram, source) == expected


def test_ngram_lookup_equals_brute_force_on_random_sequences():
    rng = random.Random(0)
    for _ in range(4000):
        vocab = rng.randint(1, 6)  # small vocabularies: many, overlapping matches
        context = [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        source = None if rng.random() < 0.5 else [rng.randrange(vocab) for _ in range(rng.randint(0, 40))]
        k, max_ngram = rng.randint(0, 8), rng.randint(1, 6)
        min_ngram = rng.randint(1, max_ngram)
        args = (context, k, max_ngram, min_ngram, source)
        assert ngram_match(*args)[0] == brute_force_lookup(*args), args


def test_cached_answer_proposer_follows_then_realigns_after_a_correction():
    answer = [10, 11, 12, 13, 14, 15, 16]
    proposer = CachedAnswerProposer(answer, fallback=NgramProposer())
    prompt = [1, 2]
    proposer.reset(prompt, SamplingConfig(), torch.Generator())
    assert proposer.propose(prompt, budget(4, 3)).tokens == [10, 11, 12]
    assert proposer.propose(prompt + [10, 11], budget(4, 3)).tokens == [12, 13, 14]
    # the target replaced 12 by 99 and went on with 13 14: re-align after "13 14" in the cached answer
    assert proposer.propose(prompt + [10, 11, 99, 13, 14], budget(4, 3)).tokens == [15, 16]


COMPOSED = {
    "lookup": lambda d: (NgramProposer(), FixedK(8, span=8)),
    "hybrid": lambda d: (HybridProposer(NgramProposer(), DraftModelProposer(d)), FixedK(3)),
    "hybrid-adaptive": lambda d: (HybridProposer(NgramProposer(), DraftModelProposer(d, CONFIDENCE_CUTOFF)),
                                  AdaptiveK(k_init=2, k_max=6)),
    "draft-adaptive": lambda d: (DraftModelProposer(d, CONFIDENCE_CUTOFF), AdaptiveK(k_init=3)),
    "draft-trimmed-head": lambda d: (DraftModelProposer(d, head_tokens=3), FixedK(4)),
    "cached-answer": lambda d: (CachedAnswerProposer([5, 6, 7, 8, 9] * 4, DraftModelProposer(d)),
                                FixedK(3, span=6)),
    "fast-draft": lambda d: (PROPOSERS["fast-draft"](lambda: d), FixedK(3)),  # the registry's, as the app
}


@pytest.mark.parametrize("name", COMPOSED)
@pytest.mark.parametrize("seed", range(3))
def test_greedy_equality_for_every_proposer(name, seed):
    target, draft = tiny_pair(seed)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6][: 4 + 3 * seed]  # repeats, so lookups find matches
    sampling = SamplingConfig(max_new_tokens=48, stop_on_eos=False)
    proposer, policy = COMPOSED[name](cached(draft))
    ref = reference_done(target, prompt, sampling)
    spec = speculative_done(target, proposer, policy, prompt, sampling)
    assert spec.token_ids == ref.token_ids
    assert spec.stats.acceptance.proposed > 0


@pytest.mark.parametrize("name", PROPOSER_NAMES)
@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("seed", range(2))
def test_greedy_equality_for_every_registry_entry(name, adaptive, seed, monkeypatch):
    """What the app runs: each registry entry as built there, fixed or adaptive k."""
    monkeypatch.setattr(engine.proposers, "HEAD_TOKENS", 20)  # trim the tiny vocabulary's head too
    target, draft = tiny_pair(seed)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6][: 4 + 3 * seed]
    sampling = SamplingConfig(max_new_tokens=48, stop_on_eos=False)
    policy = AdaptiveK(k_init=3, k_max=8) if adaptive else FixedK(3)
    spec = speculative_done(target, PROPOSERS[name](lambda: cached(draft)), policy, prompt, sampling)
    assert spec.token_ids == reference_done(target, prompt, sampling).token_ids
    assert spec.stats.acceptance.proposed > 0


def test_registry_entries_make_a_draft_runner_only_when_they_draft_with_the_model():
    _, draft = tiny_pair(0)
    made = {}
    for name in PROPOSERS:
        runners = DraftRunners(draft)
        made[name] = (PROPOSERS[name](runners), len(runners.made))
    assert {name: n for name, (_, n) in made.items()} == {"draft": 1, "fast-draft": 1, "lookup": 0, "hybrid": 1}
    assert {name for name, (_, n) in made.items() if n == 0} == FREE_PROPOSERS
    textbook, fast = made["draft"][0], made["fast-draft"][0]
    assert (textbook.min_confidence, textbook.head_tokens) == (0.0, None)
    assert (fast.min_confidence, fast.head_tokens) == (CONFIDENCE_CUTOFF, HEAD_TOKENS)
    default = made[DEFAULT_SPEC.proposer][0]  # the app's default: prompt lookup + the fast draft
    assert isinstance(default.lookup, NgramProposer)
    assert (default.model.min_confidence, default.model.head_tokens) == (CONFIDENCE_CUTOFF, HEAD_TOKENS)


def test_a_draft_is_free_when_it_is_one_hot_and_not_empty():
    assert Draft([4, 5]).free and Draft([4, 5]).truncate(1).free
    assert not Draft([4], torch.full((1, 8), 1 / 8)).free  # a model's draft: its distributions cost a forward
    assert not EMPTY_DRAFT.free and not Draft([4, 5]).truncate(0).free  # no draft: a plain target step


@pytest.mark.parametrize("name", sorted(FREE_PROPOSERS))
def test_a_free_registry_entry_makes_only_free_drafts(name):
    proposer = PROPOSERS[name](lambda: pytest.fail("a free proposer made a draft model"))
    proposer.reset([1, 2, 3, 1, 2], SamplingConfig(), torch.Generator())
    drafts = [proposer.propose([1, 2, 3, 1, 2, 3, 1, 2][:n], budget(4)) for n in range(3, 9)]
    assert any(len(d) for d in drafts) and all(d.free for d in drafts if len(d))


@pytest.mark.parametrize("name", PROPOSER_NAMES)
def test_each_registry_entry_labels_its_stats_and_traces_with_its_own_name(name):
    """The stats' ``proposer`` (what the app shows and the trace export keeps) is the entry the request chose:
    ``fast-draft`` is not labelled ``draft``, though both draft with the draft model."""
    target, draft = tiny_pair(0)
    assert PROPOSERS[name](DraftRunners(draft)).name == name
    sampling = SamplingConfig(max_new_tokens=8, stop_on_eos=False)
    done = final_done(start_speculative(target, draft, [3, 4, 5], sampling, SpecConfig(k=2, proposer=name)))
    assert done.stats.proposer == name


@pytest.mark.parametrize("name", ["lookup", "hybrid", "cached-answer", "draft-trimmed-head", "fast-draft"])
@pytest.mark.slow
def test_sampling_distribution_for_one_hot_and_mixed_drafts(name, monkeypatch):
    monkeypatch.setattr(engine.proposers, "HEAD_TOKENS", 3)  # the fast draft: cut-off and a trimmed head
    vocab, n = 5, 2500
    target_model = tiny_model(3, vocab=vocab)
    draft_model = tiny_model(4, vocab=vocab, base=target_model, noise=0.4)
    tok = ByteTokenizer()
    target, draft = wrap_model("t", "fp32", target_model, tok), wrap_model("d", "fp32", draft_model, tok)
    prompt = [1, 2, 1, 2, 1]  # lookup proposes "2 1 2 ..."; a trimmed head of 3 drafts only ids 0-2
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=3, stop_on_eos=False)
    exact = exact_sequence_probs(target_model, prompt, 3, sampling)

    def spec(i):
        proposer, policy = (COMPOSED[name] if name != "cached-answer" else
                            (lambda d: (CachedAnswerProposer([2, 1, 2], DraftModelProposer(d)), FixedK(2))))(
            cached(draft))
        return speculative_done(target, proposer, policy, prompt, SamplingConfig(**{**sampling.__dict__, "seed": i}))
    tv = total_variation(sequence_distribution(spec, n), exact, n)
    assert tv < 0.1, tv


def test_trimmed_head_drafts_only_kept_tokens_and_matches_full_logits_there():
    target, draft = tiny_pair(0)
    full, trimmed = cached(draft), cached(draft)
    trimmed.trim_head([1, 2, 3, 30])
    a, b = full.forward([5, 6, 7], 2), trimmed.forward([5, 6, 7], 2)  # (2, vocab)
    kept = torch.tensor([1, 2, 3, 30])
    assert torch.allclose(a[:, kept], b[:, kept], atol=1e-5)
    assert torch.isinf(b).sum() == 2 * (b.shape[1] - 4)
    assert trimmed.cache_len() == len(trimmed.tokens) == 3
