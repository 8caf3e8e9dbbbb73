"""How many tokens to draft next step. Fixed, or adaptive to the acceptance seen so far."""
from __future__ import annotations

from typing import Protocol


class KPolicy(Protocol):
    fallback: bool

    def next_k(self) -> int: ...

    def update(self, n_accepted: int, n_proposed: int, stats) -> None: ...


class FixedK:
    fallback = False

    def __init__(self, k: int):
        self.k = k

    def next_k(self) -> int:
        return self.k

    def update(self, n_accepted: int, n_proposed: int, stats) -> None:
        """A fixed k ignores feedback."""
