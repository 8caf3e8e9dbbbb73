"""Pure verification math on hand-made distributions."""
import pytest
import torch

from engine.decode.verify import verify_greedy, verify_rejection


def one_hot_rows(tokens, vocab=5, mass=0.9):
    p = torch.full((len(tokens), vocab), (1 - mass) / (vocab - 1))
    p[torch.arange(len(tokens)), torch.tensor(tokens)] = mass
    return p


def test_greedy_perfect_match_gives_bonus():
    p_target = one_hot_rows([1, 2, 3, 4])  # (k+1, vocab)
    verdict = verify_greedy(p_target, [1, 2, 3])
    assert (verdict.n_accepted, verdict.token, verdict.kind) == (3, 4, "bonus")


def test_greedy_early_mismatch_corrects_first_rejection():
    p_target = one_hot_rows([1, 2, 3, 4])
    verdict = verify_greedy(p_target, [1, 0, 3])
    assert (verdict.n_accepted, verdict.token, verdict.kind) == (1, 2, "corrected")


def test_greedy_empty_draft_is_one_target_token():
    verdict = verify_greedy(one_hot_rows([3]), [])
    assert (verdict.n_accepted, verdict.token, verdict.kind) == (0, 3, "bonus")


def test_rejection_all_accepted_when_p_dominates_q():
    p_target = one_hot_rows([1, 2, 3], mass=0.9)
    q_draft = one_hot_rows([1, 2], mass=0.5)  # p >= q on the drafted tokens: always accepted
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        verdict = verify_rejection(p_target, [1, 2], q_draft, g)
        assert verdict.n_accepted == 2 and verdict.kind == "bonus"


def test_rejection_zero_target_probability_always_rejected_and_resampled_from_residual():
    p_target = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q_draft = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    g = torch.Generator().manual_seed(0)
    tokens = {verify_rejection(p_target, [0], q_draft, g).token for _ in range(100)}
    assert tokens == {1, 2}  # residual max(0, p - q) puts mass only on 1 and 2


def test_rejection_one_hot_draft_accepts_with_probability_p():
    p_target = torch.tensor([[0.3, 0.7], [0.5, 0.5]])
    g = torch.Generator().manual_seed(1)
    verdicts = [verify_rejection(p_target, [0], None, g) for _ in range(4000)]
    accept_rate = sum(v.n_accepted for v in verdicts) / len(verdicts)
    assert abs(accept_rate - 0.3) < 0.03
    # on rejection (q_draft=None), the rejected token is removed from p: only token 1 remains
    assert all(v.token == 1 for v in verdicts if v.n_accepted == 0)


@pytest.mark.slow  # a sampling distribution: 20,000 seeded verifies, 4-5 s on 2 cores
def test_rejection_output_matches_target_distribution():
    """First-token marginal of rejection sampling equals p_target[0] whatever q is."""
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.4, 0.3, 0.2, 0.1])
    g = torch.Generator().manual_seed(2)
    counts = torch.zeros(4)
    n = 20000
    for _ in range(n):
        drafted = int(torch.multinomial(q, 1, generator=g))
        verdict = verify_rejection(torch.stack([p, p]), [drafted], q[None], g)
        counts[drafted if verdict.n_accepted else verdict.token] += 1
    tv = 0.5 * (counts / n - p).abs().sum()
    assert tv < 0.02, tv
