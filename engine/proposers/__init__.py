"""Proposer registry: name -> factory taking the loaded pair's runners. Siblings, not subclasses."""
from engine.proposers.base import EMPTY_DRAFT, Draft, Proposer
from engine.proposers.draft_model import DraftModelProposer

PROPOSERS = {
    "draft": lambda draft: DraftModelProposer(draft),
}

__all__ = ["Draft", "EMPTY_DRAFT", "Proposer", "PROPOSERS", "DraftModelProposer"]
