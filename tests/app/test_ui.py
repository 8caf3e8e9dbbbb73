"""app/ui.py: the whole Blocks builds from its tabs without an engine's models, torch or transformers."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_building_the_ui_imports_no_torch():
    """Not only the imports: building the whole Blocks (dropdown choices, defaults, handlers) stays torch-free."""
    subprocess.run([sys.executable, "-m", "tests.helpers.build_ui"], cwd=REPO, check=True, timeout=300)
