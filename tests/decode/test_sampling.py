import pytest
import torch

from engine.config import SamplingConfig, SpecConfig
from engine.errors import InvalidSettingError
from engine.decode.sampling import logits_to_probs, sample


def test_greedy_is_argmax_of_plain_softmax():
    logits = torch.tensor([1.0, 3.0, 2.0])
    probs = logits_to_probs(logits, SamplingConfig())
    assert torch.allclose(probs, torch.softmax(logits, -1))
    assert sample(probs, SamplingConfig(), None) == 1


def test_top_k_and_top_p_filter_and_renormalise():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    top_k = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_k=2))
    assert torch.allclose(top_k, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    top_p = logits_to_probs(logits, SamplingConfig(temperature=1.0, top_p=0.8))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0.0, 0.0]))


def test_temperature_sharpens():
    logits = torch.tensor([1.0, 2.0])
    cold = logits_to_probs(logits, SamplingConfig(temperature=0.5))
    assert cold[1] > torch.softmax(logits, -1)[1]


@pytest.mark.parametrize("kwargs", [{"temperature": -1}, {"top_p": 0}, {"top_k": -3}, {"max_new_tokens": 0}])
def test_bad_sampling_settings_are_refused(kwargs):
    with pytest.raises(InvalidSettingError):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("k", [0, -1, 10_000])
def test_bad_k_is_refused(k):
    with pytest.raises(InvalidSettingError, match="k"):
        SpecConfig(k=k)
