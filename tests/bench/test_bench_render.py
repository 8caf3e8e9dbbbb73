"""bench/speed/render.py: the render benchmark's synthetic answer and its timed updates."""
from bench.speed.render import synthetic_tokens, time_updates


def test_render_bench_reports_milliseconds():
    tokens = synthetic_tokens(60)
    assert len(tokens) == 60 and "```python" in "".join(t.text for t in tokens)
    assert len(time_updates(tokens, every=20)) == 3
