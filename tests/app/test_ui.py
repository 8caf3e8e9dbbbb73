"""app/ui.py: the whole Blocks builds from its tabs without an engine's models, torch or transformers."""
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_building_the_ui_imports_no_torch():
    """Not only the imports: building the whole Blocks (dropdown choices, defaults, handlers) stays torch-free."""
    subprocess.run([sys.executable, "-m", "tests.helpers.build_ui"], cwd=REPO, check=True, timeout=300)


def test_the_served_page_keeps_no_run_history():
    """Gradio 6.31 records every run's inputs and outputs (prompts, answers) in the browser's localStorage and rewrites
    the list at each streamed frame unless the app says no: the served config says no, and the runs page is gone."""
    import httpx

    from app.api.openai_routes import create_server
    from app.context import AppContext
    from app.ui import build_demo, launch_kwargs
    from tests.helpers.fakes import FakeEngine
    from tests.helpers.server import serving

    ctx = AppContext(FakeEngine([], cache=False))
    with serving(create_server(ctx, build_demo(ctx), None, **launch_kwargs())) as url:
        config = httpx.get(f"{url}config", timeout=30).json()
        assert config["run_history"] is False
        assert "runs" not in config.get("footer_links", [])
        assert httpx.get(f"{url}gradio_api/runs", timeout=30).status_code == 404
