"""app/views/divergence.py: a divergence explained in words (a rounding tie, or a bug), and the fp32 proof."""
from app.views.divergence import divergence_html, divergence_text, proof_html
from tests.helpers.fakes import assert_inert, div_dict


def test_divergence_explained_as_a_tie_with_position_tokens_and_margin():
    html = divergence_html(div_dict())
    assert_inert(html)
    text = divergence_text(div_dict())
    assert "token 12" in text and "' n' (id 304)" in text and "(id 7923)" in text
    assert "margin there is 0.125" in text and "bf16 logits near 18.4 are 0.125 apart" in text
    assert "tie within bf16 rounding, not a speculation error" in text
    assert 'data-position="12"' in html and "race-tie" in html


def test_a_wide_margin_is_called_a_bug():
    text = divergence_text(div_dict(margin=3.5, within=False))
    assert "would be a bug" in text and "tie" not in text
    assert "race-bug" in divergence_html(div_dict(margin=3.5, within=False))


def test_fp32_proof_says_identical_with_timing_or_the_honest_result():
    ok = {"identical": True, "n_tokens": 20, "divergence": None, "seconds": 3.21, "load_seconds": 1.5}
    assert "✓ identical in fp32: 20 tokens" in proof_html(ok) and "3.2 s" in proof_html(ok)
    assert "1.5 s loading" in proof_html(ok)
    bad = {**ok, "identical": False, "divergence": div_dict(margin=2.0, within=False)}
    assert "still different in fp32" in proof_html(bad) and "bug" in proof_html(bad)
    assert_inert(proof_html(bad))
