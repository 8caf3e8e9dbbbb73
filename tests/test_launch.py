"""launch.py refuses a bad --cache-dir with a readable message, before loading anything."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_launch(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "launch.py", "--no-browser", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


def test_cache_dir_that_is_a_file_ends_with_a_message_not_a_traceback(tmp_path):
    not_a_dir = tmp_path / "cache.txt"
    not_a_dir.write_text("I am a file")
    for cache_dir in (not_a_dir, not_a_dir / "inside"):
        result = run_launch("--cache-dir", str(cache_dir))
        assert result.returncode == 1
        assert "is a file, not a directory" in result.stderr and "Traceback" not in result.stderr
        assert "loading target" not in result.stdout
