"""Engines on the test run's pooled real models (tests/conftest.py ``RealModels``), measured once per run."""
from __future__ import annotations

import warnings


def use_pooled(engine, target, draft) -> None:
    """``engine.use_models`` on pooled models. The app keeps a torch pair's quiet load-time figures with its loaded
    objects (engine/serve/kept_figures.py), so a later engine on them reuses them; a busy measurement it does not
    keep, and measures again at the next load. A run's later engines reuse a busy one too (its flag still says busy):
    in one CI on 2 Zen 3 cores the SmolLM2 int8 pair measured busy three times, about 85 s each. Warned, so the
    run's warnings summary says which pair and why."""
    from engine.serve.kept_figures import LOADED_PAIRS, pair_key
    engine.use_models(target, draft)
    checks = engine.slot.require().checks
    kept = LOADED_PAIRS.get(target, draft)
    if checks is not None and checks.busy and pair_key(target, draft) is None and kept is None:
        LOADED_PAIRS.put(target, draft, checks)
        warnings.warn(f"{target.name} {target.precision} / {draft.name} {draft.precision} measured busy "
                      f"({checks.busy}): this run's later engines on the same models reuse its figures", stacklevel=2)
