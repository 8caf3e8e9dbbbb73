"""The clock of one decode step: how long proposing and verifying took, as a StepRecord.

Every read first waits for the target runner's queued work (``Runner.synchronize``): GPU kernels run asynchronously
and the logits stay on the device, so a bare clock read would time the kernels' launch, not their work.
"""
from __future__ import annotations

import time

from engine.decode.draft import Draft
from engine.backends.contract import Runner
from engine.decode.step import StepRecord


class StepClock:
    """Started when made; ``lap()`` ends the propose phase (a step that skips it, like the reference decoder's,
    has no propose time), and ``step(...)`` ends the verify phase and returns the step's record."""

    def __init__(self, runner: Runner):
        self.runner = runner
        self._start = self._now()
        self._proposed = self._start

    def _now(self) -> float:
        self.runner.synchronize()
        return time.perf_counter()

    def lap(self) -> None:
        self._proposed = self._now()

    def step(self, draft: Draft, n_accepted: int, n_fed: int, offered: Draft | None = None,
             token: int | None = None) -> StepRecord:
        """The step's record; ``offered``: the free draft before the budget cut it, and ``token`` the target's new
        token, so a free draft cut to nothing still tells its class whether its first token was right."""
        end = self._now()
        unverified = offered is not None and offered.free and not draft.tokens
        return StepRecord(n_drafted=len(draft), n_accepted=n_accepted, n_fed=n_fed,
                          draft_s=self._proposed - self._start, verify_s=end - self._proposed,
                          free=draft.free, source=draft.source,
                          evidence=offered.evidence_class if unverified else draft.evidence_class if draft.free else "",
                          draft_fed=draft.fed, unverified_agreed=offered.tokens[0] == token if unverified else None)
