"""How the page's events run: the one queue of the events that run the models (one generation, load or experiment at
a time, the rest wait), and which components an event's progress is tracked on."""
from __future__ import annotations

ENGINE = dict(concurrency_id="engine", concurrency_limit=1)

# No progress shown, and none tracked. Gradio's page keeps a loading status for every component that was ever a
# progress target of an event that ran (an event's ``show_progress_on``, or all its outputs when that is None), and at
# every message of any event it updates each of them, reading a snapshot of the component's props, its whole value
# included (js/core ``update_loading_stati_state`` -> ``update_state`` -> a Svelte ``$state.snapshot``, which clones
# every string of it). The chat, the plots and the cache table written once after an answer were snapshotted at every
# frame of every later answer, a cost that grew with the conversation (docs/bench.md, "What a frame clones").
# An empty list is kept as is in the config ([] is no progress target at all; None would be every output).
UNTRACKED = dict(show_progress="hidden", show_progress_on=[])
