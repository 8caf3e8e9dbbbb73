"""One answer as it streams: the events seen so far, and the trace that the export writes."""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field

from app.views.divergence import divergence_text
from app.views.markdown import render_markdown
from app.views.render import render_answer
from engine.events import CacheEvent, DoneEvent, StatsEvent, TokenEvent
from engine.surface import PairInfo


@dataclass
class Turn:
    tokens: list[TokenEvent] = field(default_factory=list)
    stats: StatsEvent | None = None
    cache: CacheEvent | None = None
    done: DoneEvent | None = None
    events: list[dict] = field(default_factory=list)  # every event, as to_dict(), in order

    def add(self, event) -> None:
        self.events.append(event.to_dict())
        if isinstance(event, TokenEvent):
            self.tokens.append(event)
        elif isinstance(event, StatsEvent):
            self.stats = event
        elif isinstance(event, CacheEvent):
            self.cache = event
        elif isinstance(event, DoneEvent):
            self.done, self.stats = event, event.stats

    @property
    def text(self) -> str:
        return self.done.text if self.done is not None else "".join(t.text for t in self.tokens)

    @property
    def finish_reason(self) -> str | None:
        return self.done.finish_reason if self.done is not None else None

    def html(self, streaming: bool = False) -> str:
        """Both views (Markdown and raw tokens), always with the rejected draft tokens: the "show rejected"
        and "answer view" switches pick what shows with CSS."""
        return render_answer(self.tokens, self.cache, self.finish_reason, streaming=streaming,
                             markdown_html=render_markdown(self.tokens))

    def kind_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for t in self.tokens:
            counts[t.kind] = counts.get(t.kind, 0) + 1
        return counts


def trace_document(turn: Turn, messages: list[dict], pair: PairInfo | None, settings: dict, divergence=None,
                   reference: Turn | None = None) -> dict:
    """What the export writes: the pair, the settings, the conversation, and every event of the answer.

    A race adds the target-only answer's events (``reference``) and, where the two differ, the divergence
    (engine.divergence.Divergence) with its explanation in words."""
    doc = {"format": "speclens-trace/1", "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "pair": asdict(pair) if pair is not None else None, "settings": settings, "messages": messages,
           "events": turn.events}  # the live list: the document grows with the answer
    if reference is not None:
        doc["target_only_events"] = reference.events
    if divergence is not None:
        doc["divergence"] = {**divergence.to_dict(), "explanation": divergence_text(divergence)}
    return doc


def write_trace(doc: dict, path) -> str:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
    return str(path)
