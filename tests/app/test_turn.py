"""app/turn.py: one answer's events as it streams, both of its views, and the trace the export writes."""
import json

from app.settings import UISettings
from app.turn import Turn, trace_document
from app.views.render import render_tokens
from engine.events import CacheEvent
from tests.helpers.fakes import done, stats, tok, toks


def test_turn_collects_every_event_for_the_trace():
    turn = Turn()
    events = [CacheEvent("miss"), tok("a"), tok("b", "bonus"), stats(), done()]
    for e in events:
        turn.add(e)
    doc = trace_document(turn, [{"role": "user", "content": "hi"}], None, UISettings().to_dict())
    assert [e["type"] for e in json.loads(json.dumps(doc))["events"]] == ["cache", "token", "token", "stats", "done"]
    assert turn.kind_counts() == {"accepted": 1, "bonus": 1}


def test_answer_holds_both_views_and_the_raw_view_is_unchanged():
    turn = Turn()
    for ev in toks("**x**", " y"):
        turn.add(ev)
    html = turn.html()
    assert '<div class="md-view"><p><strong>' in html and '<div class="raw-view">' in html
    assert html.count('class="tokstream') == 1
    assert f'<div class="raw-view">{render_tokens(toks("**x**", " y"))}</div>' in html
