"""Predicted outputs as a free draft (engine/proposers/prediction.py): the place in the prediction is kept while the
answer follows it and found again after the answer departs; the answer stays the target's, greedy and sampled."""
from __future__ import annotations

import pytest
import torch

from engine.config import SamplingConfig, SpecConfig
from engine.decode.kpolicy import FixedK
from engine.events import final_done
from engine.models.loading import wrap_model
from engine.proposers import DraftModelProposer, NgramProposer
from engine.proposers.prediction import PredictionProposer, find_match
from engine.start.decoders import start_speculative
from tests.helpers.tiny import (ByteTokenizer, budget, cached, exact_sequence_probs, reference_done, sequence_distribution,
                                speculative_done, tiny_model, tiny_pair, total_variation)

PROMPT = [1, 2]


def _proposer(prediction):
    proposer = PredictionProposer(prediction, fallback=NgramProposer())
    proposer.reset(PROMPT, SamplingConfig(), torch.Generator())
    return proposer


def test_find_place_takes_the_longest_suffix_and_the_first_occurrence_from_the_anchor():
    prediction = [7, 8, 9, 1, 7, 8, 9, 2, 7, 8, 9, 3]
    assert find_match([5, 7, 8, 9], prediction, anchor=0)[0] == 3  # three occurrences: the first from the anchor
    assert find_match([5, 7, 8, 9], prediction, anchor=5)[0] == 7
    assert find_match([5, 7, 8, 9], prediction, anchor=12)[0] == 3  # none after it: the first anywhere
    assert find_match([1, 7, 8, 9], prediction, anchor=9)[0] == 7  # a longer n-gram is more specific than the anchor
    assert find_match([8, 9, 3], prediction, anchor=0) is None  # at the end: nothing left to propose
    assert find_match([4, 5, 6], prediction, anchor=0) is None
    assert find_match([8, 9], prediction, anchor=0) is None  # shorter than min_ngram


def test_the_prediction_is_followed_then_found_again_after_the_answer_departs():
    prediction = [10, 11, 12, 13, 14, 15, 16, 17, 18]
    proposer = _proposer(prediction)
    draft = proposer.propose(PROMPT, budget(4, 3))
    assert (draft.tokens, draft.source, draft.free) == ([10, 11, 12], "prediction", True)  # from the start
    # the target took 10 11 and its own next token was the prediction's 12: go on after it
    assert proposer.propose(PROMPT + [10, 11, 12], budget(4, 3)).tokens == [13, 14, 15]
    # it replaced 13 by 99 (an edit): lost until the answer rejoins; the fallback (a lookup) has nothing
    assert proposer.propose(PROMPT + [10, 11, 12, 99], budget(4, 3)).tokens == []
    assert proposer.propose(PROMPT + [10, 11, 12, 99, 14, 15, 16], budget(4, 3)).tokens == [17, 18]  # rejoined after 14 15 16
    assert proposer.propose(PROMPT + [10, 11, 12, 99, 14, 15, 16, 17, 18], budget(4, 3)).tokens == []  # the prediction is used up


def test_an_answer_back_on_the_prediction_by_one_plain_token_has_rejoined_it_until_it_agrees_long_enough():
    """A span cut to nothing (the policy priced it out) and the target's one token is the prediction's: "rejoined",
    weaker than a span taken whole and priced apart (an edit that rewrites most lines agrees a token at a time);
    after FOLLOWING_MATCH tokens of agreement, or a span taken whole with the target's own next token, "following"."""
    prediction = list(range(10, 60))
    proposer = _proposer(prediction)
    proposer.propose(PROMPT + [99], budget(4, 8))  # words of its own: nothing
    answer = PROMPT + [99, 20, 21, 22]
    assert proposer.propose(answer, budget(4, 8)).evidence == "match-3"
    evidence = []
    for token in range(23, 30):  # one plain target token a step, each the prediction's
        answer = answer + [token]
        evidence.append(proposer.propose(answer, budget(4, 8)).evidence)
    assert evidence == ["rejoined"] * 4 + ["following"] * 3  # 3 matched + 5 taken: FOLLOWING_MATCH tokens
    answer = answer + [98]  # departed (the target's correction)
    assert proposer.propose(answer, budget(4, 8)).source != "prediction"
    answer = answer + [40, 41, 42]
    assert proposer.propose(answer, budget(4, 8)).evidence == "match-3"  # found again elsewhere
    draft = proposer.propose(answer + [43, 44], budget(4, 8))  # a span taken whole, and the target's next token
    assert draft.evidence == "following" and draft.tokens[0] == 45


def test_an_answer_that_opens_with_words_of_its_own_finds_the_prediction_later():
    proposer = _proposer([10, 11, 12, 13, 14, 15])
    assert proposer.propose(PROMPT, budget(4, 8)).tokens == [10, 11, 12, 13, 14, 15]
    preamble = PROMPT + [40, 41, 42]  # "Here is the file:" instead
    assert proposer.propose(preamble, budget(4, 8)).tokens == []
    assert proposer.propose(preamble + [10, 11, 12], budget(4, 8)).tokens == [13, 14, 15]


@pytest.mark.parametrize("seed", range(3))
def test_greedy_answer_is_the_targets_with_a_right_a_wrong_and_an_edited_prediction(seed):
    target, draft = tiny_pair(seed)
    prompt = [5, 6, 7, 8, 5, 6][: 3 + seed]
    sampling = SamplingConfig(max_new_tokens=40, stop_on_eos=False)
    ref = reference_done(target, prompt, sampling)
    answer = list(ref.token_ids)
    edited = answer[:10] + [3, 3, 3] + answer[14:]
    for prediction in (answer, [9] * 30, edited):
        proposer = PredictionProposer(prediction, DraftModelProposer(cached(draft)))
        done = speculative_done(target, proposer, FixedK(3), prompt, sampling)
        assert done.token_ids == ref.token_ids
    predicted = done.stats.of_source("prediction")
    assert predicted.accepted >= 20 and predicted.proposed > predicted.accepted  # the edit was rejected


def test_the_stats_count_the_predictions_tokens_apart_through_start_speculative():
    target, draft = tiny_pair(0)
    prompt, sampling = [5, 6, 7], SamplingConfig(max_new_tokens=30, stop_on_eos=False)
    ref = reference_done(target, prompt, sampling)
    done = final_done(start_speculative(target, draft, prompt, sampling, SpecConfig(k=2, proposer="draft"),
                                        prediction=tuple(ref.token_ids)))
    assert done.token_ids == ref.token_ids
    predicted = done.stats.of_source("prediction")
    assert predicted.proposed > 0 and predicted.accepted == done.stats.acceptance.accepted - \
        done.stats.of_source("draft").accepted
    assert done.stats.to_dict()["by_source"]["prediction"]["accepted"] == predicted.accepted


@pytest.mark.slow
def test_sampling_with_a_prediction_keeps_the_targets_distribution():
    vocab, n = 5, 2500
    target_model = tiny_model(3, vocab=vocab)
    draft_model = tiny_model(4, vocab=vocab, base=target_model, noise=0.4)
    tok = ByteTokenizer()
    target, draft = wrap_model("t", "fp32", target_model, tok), wrap_model("d", "fp32", draft_model, tok)
    prompt = [1, 2, 1, 2, 1]
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=3, stop_on_eos=False)
    exact = exact_sequence_probs(target_model, prompt, 3, sampling)

    def spec(i):
        proposer = PredictionProposer([2, 1, 2, 0], DraftModelProposer(cached(draft)))
        return speculative_done(target, proposer, FixedK(2), prompt, SamplingConfig(**{**sampling.__dict__, "seed": i}))
    tv = total_variation(sequence_distribution(spec, n), exact, n)
    assert tv < 0.1, tv


def test_a_prediction_that_cannot_be_text_or_cannot_fit_is_refused_with_the_reason():
    from engine.errors import InvalidSettingError, PromptTooLongError
    from engine.models.prompt import encode_prediction

    tok = ByteTokenizer()
    assert encode_prediction(tok, "", 64) == [] and len(encode_prediction(tok, "abc", 64)) == 3
    with pytest.raises(InvalidSettingError, match="the prediction contains a NUL"):
        encode_prediction(tok, "a\x00b", 64)
    with pytest.raises(PromptTooLongError, match="the prediction is 65 tokens; .* no answer could restate it"):
        encode_prediction(tok, "x" * 65, 64)
    with pytest.raises(PromptTooLongError, match="the prediction \\(1,000 characters\\)"):
        encode_prediction(tok, "x" * 1000, 64)
