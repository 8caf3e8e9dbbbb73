"""Proposer registry: name -> factory. Siblings, not subclasses."""
from engine.proposers.base import EMPTY_DRAFT, Draft, Proposer
from engine.proposers.draft_model import DraftModelProposer
from engine.proposers.hybrid import HybridProposer
from engine.proposers.ngram import NgramProposer

# Drafting one more token pays while P(all drafted so far are right) beats the draft/target cost ratio,
# which is about 0.2-0.4 for a 3x smaller draft on CPU; below this the adaptive modes stop drafting early.
CONFIDENCE_CUTOFF = 0.25

PROPOSERS = {  # factory(draft runner, adaptive) -> proposer
    "draft": lambda draft, adaptive: DraftModelProposer(draft, CONFIDENCE_CUTOFF if adaptive else 0.0),
    "lookup": lambda draft, adaptive: NgramProposer(),
    "hybrid": lambda draft, adaptive: HybridProposer(
        NgramProposer(), DraftModelProposer(draft, CONFIDENCE_CUTOFF if adaptive else 0.0)),
}

__all__ = ["Draft", "EMPTY_DRAFT", "Proposer", "PROPOSERS", "DraftModelProposer", "NgramProposer",
           "HybridProposer", "CONFIDENCE_CUTOFF"]
