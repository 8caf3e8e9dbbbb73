"""Known text stops at the chat template's turn markers (``Draft.before``): a prompt lookup that runs on past the
end of the user's text would draft ``<|im_end|>``, the next turn's header and the answer's own start, which the
answer never repeats there (on the default pair a 45-wide verify that took 1 token: edit-typehints 0.88x target-only).
"""
import pytest
import torch

from engine.config import SamplingConfig
from engine.decode.draft import Draft
from engine.decode.reference import reference_generate
from engine.decode.speculative import speculative_generate
from engine.decode.stream import TokenStream
from engine.models.loading import runner_for
from engine.models.prompt import template_ids
from engine.proposers import NgramProposer
from tests.helpers.constants import SMOL
from tests.helpers.curves import OnThisCurve


def test_a_free_draft_stops_before_its_first_marker_and_a_models_draft_is_left_as_it_is():
    markers = frozenset({5, 9})
    assert Draft([1, 2, 5, 3, 9], source="lookup", evidence="match-3").before(markers) \
        == Draft([1, 2], source="lookup", evidence="match-3")
    assert Draft([9, 2], source="lookup").before(markers).tokens == []  # no draft: a target-only step
    plain = Draft([1, 2, 3], source="lookup")
    assert plain.before(markers) is plain and plain.before(frozenset()) is plain
    model = Draft([1, 5, 3], q_probs=torch.full((3, 10), 0.1), source="draft")
    assert model.before(markers) is model  # a model's draft is the model's guess, an end of answer included


class SeenLookup(NgramProposer):
    """The prompt lookup, keeping what it proposed before the loop cut it."""

    def __init__(self):
        super().__init__(min_ngram=3)
        self.proposed: list[list[int]] = []

    def propose(self, context_ids, budget):
        draft = super().propose(context_ids, budget)
        self.proposed.append(draft.tokens)
        return draft


@pytest.mark.real
@pytest.mark.usefixtures("llama_cpp")
def test_a_lookup_that_runs_past_the_prompts_end_drafts_no_marker_on_a_real_model(real_models):
    """SmolLM2 on llama.cpp restates the function that ends the prompt: the lookup's continuation runs into the
    template's ``<|im_end|>`` (seen), yet no drafted token the loop reports (accepted, or the one rejected) is a
    marker, and the answer is the target's own."""
    smol = real_models.model(SMOL, "gguf")
    text = "Add a docstring to this function and return the whole function:\n\ndef area(width, height):\n" \
           "    return width * height"
    prompt = template_ids(smol.tokenizer, [{"role": "user", "content": text}])
    sampling = SamplingConfig(max_new_tokens=40)

    def stream():
        return TokenStream(smol.tokenizer, smol.eos_ids, sampling.max_new_tokens)

    reference = [e.token_id for e in reference_generate(runner_for(smol, prompt), prompt, stream(), sampling)
                 if e.type == "token"]
    lookup, markers = SeenLookup(), stream().special_ids
    events = [e for e in speculative_generate(runner_for(smol, prompt), lookup, prompt, stream(), sampling,
                                              OnThisCurve(32)) if e.type == "token"]
    assert [e.token_id for e in events] == reference
    assert any(markers & set(tokens) for tokens in lookup.proposed), "the lookup never reached the prompt's end"
    assert not [e for e in events if e.kind == "accepted" and e.token_id in markers]
    assert not [e.rejected_text for e in events if e.rejected_special]
