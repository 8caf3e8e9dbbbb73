"""Importing the model loader changes no warning filter and no logger level; ``quiet_library_logs()`` does, once.

Run as ``python -m tests.helpers.quiet_logs`` (tests/models/test_model_sources.py does): the filters must be read
in an interpreter where nothing has imported the loader yet.
"""
from __future__ import annotations

import logging
import warnings


def main() -> None:
    import torch, engine.config, engine.errors, engine.models.catalog, engine.models.hardware  # noqa: E401,F401
    import engine.models.int8_weight  # noqa: F401
    bnb = logging.getLogger("bitsandbytes.autograd._functions")
    before = (list(warnings.filters), bnb.level)
    from engine.models.loading import quiet_library_logs
    assert (list(warnings.filters), bnb.level) == before, "changed at import"
    quiet_library_logs()
    quiet_library_logs()
    added = [f for f in warnings.filters if f not in before[0]]
    assert len(added) == 4 and bnb.level == logging.ERROR, (added, bnb.level)


if __name__ == "__main__":
    main()
