"""What the target's distribution said at each position (SamplingConfig.candidates), on tiny fp32 models: the
chosen token's probability and the most likely tokens beside it, as a plain forward over the answer gives them."""
import pytest
import torch

from engine.config import SamplingConfig
from engine.decode.reference import reference_generate
from engine.decode.sampling import logits_to_probs, top_tokens
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.proposers.draft_model import DraftModelProposer
from engine.decode.kpolicy import FixedK
from tests.helpers.tiny import cached, run, tiny_pair
from tests.helpers.constants import SMOL

PROMPT = [3, 4, 5, 6]
N = 5


def stream(target, sampling):
    return TokenStream(target.tokenizer, target.eos_ids, sampling.max_new_tokens, sampling.stop_on_eos,
                       candidates=sampling.candidates is not None)


def generate(decoder, target, draft, sampling):
    if decoder == "speculative":
        events = speculative_generate(cached(target), DraftModelProposer(cached(draft)), PROMPT,
                                      stream(target, sampling), sampling, k_policy=FixedK(3))
    else:
        events = reference_generate(cached(target), PROMPT, stream(target, sampling), sampling)
    return [e for e in run(events) if e.type == "token"]


def plain_distribution(target, token_ids, sampling) -> torch.Tensor:
    """One forward over the prompt and the answer: row i is the distribution the answer's token i came from."""
    ids = torch.tensor([PROMPT + token_ids])
    with torch.no_grad():
        logits = target.model(ids).logits[0, len(PROMPT) - 1:-1]  # (answer, vocab)
    return logits_to_probs(logits, sampling)


@pytest.mark.parametrize("decoder", ["speculative", "reference"])
@pytest.mark.parametrize("sampling", [SamplingConfig(max_new_tokens=30, stop_on_eos=False, candidates=N),
                                      SamplingConfig(temperature=0.8, top_p=0.6, seed=5, max_new_tokens=30,
                                                     stop_on_eos=False, candidates=N)],
                         ids=["greedy", "top-p"])
def test_each_token_carries_the_targets_distribution_at_its_position(decoder, sampling):
    target, draft = tiny_pair(0)
    tokens = generate(decoder, target, draft, sampling)
    ids = [t.token_id for t in tokens]
    p = plain_distribution(target, ids, sampling)
    kinds = {t.kind for t in tokens}
    assert kinds >= ({"accepted", "corrected"} if decoder == "speculative" else {"plain"})
    for i, token in enumerate(tokens):
        chosen, top = token.candidates.chosen, token.candidates.top
        assert chosen.token_id == token.token_id and chosen.p_target == token.p_target
        assert chosen.p_target == pytest.approx(float(p[i, token.token_id]), abs=1e-5)
        expected = [v for v in torch.topk(p[i], N).values.tolist() if v > 0]
        assert [c.p_target for c in top] == pytest.approx(expected, abs=1e-5)  # most likely first, zeros left out
        assert all(c.p_target == pytest.approx(float(p[i, c.token_id]), abs=1e-5) for c in top)
        assert chosen.text == target.tokenizer.decode([token.token_id], skip_special_tokens=False)
        assert chosen.utf8 == tuple(chosen.text.encode())
        if sampling.greedy:
            assert top[0].p_target == chosen.p_target
    if sampling.top_p < 1:  # the nucleus holds fewer than N tokens somewhere: the rest had probability 0
        assert any(len(t.candidates.top) < N for t in tokens)


@pytest.mark.parametrize("decoder", ["speculative", "reference"])
def test_asking_for_candidates_changes_no_token_and_not_asking_gives_none(decoder):
    target, draft = tiny_pair(1)
    plain = SamplingConfig(temperature=0.9, seed=11, max_new_tokens=25, stop_on_eos=False)
    asked = SamplingConfig(temperature=0.9, seed=11, max_new_tokens=25, stop_on_eos=False, candidates=0)
    without, with_ = generate(decoder, target, draft, plain), generate(decoder, target, draft, asked)
    assert [t.token_id for t in without] == [t.token_id for t in with_]
    assert all(t.candidates is None for t in without)
    assert all(t.candidates.top == () and t.candidates.chosen.token_id == t.token_id for t in with_)


def test_top_tokens_orders_rows_and_leaves_out_what_the_filters_removed():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3], [0.0, 0.0, 1.0, 0.0]])
    assert top_tokens(probs, 3) == [[(2, pytest.approx(0.6)), (3, pytest.approx(0.3)), (0, pytest.approx(0.1))],
                                    [(2, 1.0)]]
    assert top_tokens(probs, 0) == [[], []]
    assert len(top_tokens(probs, 20)[0]) == 3  # more than the vocabulary: what it has


@pytest.mark.real
def test_a_byte_level_token_keeps_the_bytes_of_half_a_character():
    """SmolLM2's byte-level BPE splits "日" over tokens: each is spelled with its own bytes (its text shows U+FFFD),
    and the bytes join to the text; a special token is its name."""
    from engine.decode.detok import TokenSpeller
    from engine.models.loading import load_tokenizer

    tokenizer = load_tokenizer(SMOL)
    speller = TokenSpeller(tokenizer)
    text = "héllo 日本 ok"
    spelled = [speller.candidate(i, None) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
    assert b"".join(bytes(c.utf8) for c in spelled).decode("utf-8") == text
    assert any("\ufffd" in c.text for c in spelled)  # a token that holds part of a character
    assert speller.candidate(tokenizer.eos_token_id, None).text == tokenizer.eos_token
