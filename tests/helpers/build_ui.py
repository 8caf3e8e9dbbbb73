"""Build the whole UI on an engine with no pair loaded, in a fresh interpreter, and check that nothing imported
torch or transformers. Run as ``python -m tests.helpers.build_ui`` (tests/app/test_ui.py does): a module already
imported by the test process would hide an import the app makes."""
from __future__ import annotations

import sys


def main() -> None:
    # the app's entry points, and views a command line shares: none of them may pull in torch
    import app.api.openai_routes, app.views.divergence, app.views.markdown  # noqa: E401,F401
    import bench.speed.render, launch  # noqa: E401,F401
    from app.context import AppContext
    from app.ui import build_demo
    from engine.errors import NoPairError
    from tests.helpers.fakes import FakeEngine

    class NoPairEngine(FakeEngine):
        def info(self):
            raise NoPairError("no models loaded yet")

    demo = build_demo(AppContext(NoPairEngine([], cache=False)))
    assert demo.fns, "the UI has no event handlers"
    assert demo.analytics_enabled is False  # a local app calls nobody
    bad = [m for m in ("torch", "transformers") if m in sys.modules]
    assert not bad, f"building the UI imported {bad}"


if __name__ == "__main__":
    main()
