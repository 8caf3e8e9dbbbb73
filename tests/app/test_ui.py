"""app/ui.py: the whole Blocks builds from its tabs without an engine's models, torch or transformers."""
import subprocess
import sys


_BUILD_UI_WITHOUT_ENGINE = """
import sys
import launch
import app.api.openai_routes, app.views.markdown, bench.speed.render, app.views.divergence
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
"""


def test_building_the_ui_imports_no_torch():
    """Not only the imports: building the whole Blocks (dropdown choices, defaults, handlers) stays torch-free."""
    subprocess.run([sys.executable, "-c", _BUILD_UI_WITHOUT_ENGINE], check=True, timeout=300)
