"""The one queue of the events that run the models: one generation, load or experiment at a time, the rest wait."""
from __future__ import annotations

ENGINE = dict(concurrency_id="engine", concurrency_limit=1)
