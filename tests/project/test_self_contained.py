"""Nothing in the repository reads outside it: a fresh clone, with nothing beside it, runs its tests, its bench
commands and its docs' commands. A file that names the ``shared`` folder beside the repository (a relative path
up one level), or a ``Path(__file__)`` that climbs above the repository root, is reported.

.ci/ is left out: CI may set up what lies around a clone."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUTSIDE_CHECK = (".ci/",)
SHARED = ".." + "/shared"  # spelled in two parts, so that this file does not name it
BESIDE = re.compile(re.escape(SHARED))
CLIMB = re.compile(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]")


def repo_files(root: Path) -> list[str]:
    """The files of the checkout: git's tracked and untracked-but-not-ignored ones (a local .venv is ignored), or
    every file outside dot-folders and __pycache__ where ``root`` is not a git checkout."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                            capture_output=True, text=True)
    if listed.returncode == 0:
        return sorted(set(filter(None, listed.stdout.split("\0"))))
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                  and not any(part.startswith(".") or part == "__pycache__" for part in p.relative_to(root).parts))


def reads_outside(root: Path = REPO) -> list[str]:
    """``file:line`` for each line of a checked file that names SHARED or climbs above ``root``."""
    found = []
    for name in repo_files(root):
        if name.startswith(OUTSIDE_CHECK) or not (root / name).is_file():
            continue
        try:
            text = (root / name).read_text(encoding="utf-8")
        except UnicodeDecodeError:  # a binary file (an image): it names no path
            continue
        depth = len(Path(name).parts)  # parents[depth - 1] of the file is the root; parents[depth] is above it
        for number, line in enumerate(text.splitlines(), 1):
            if BESIDE.search(line) or any(int(n) >= depth for n in CLIMB.findall(line)):
                found.append(f"{name}:{number}")
    return found


def test_the_check_sees_a_file_reading_beside_or_above_the_repo(tmp_path):
    (tmp_path / "tests" / "data").mkdir(parents=True)
    (tmp_path / "tests" / "t.py").write_text(
        'ROOT = Path(__file__).resolve().parents[1]\nEVAL = Path(__file__).resolve().parents[2] / "shared"\n')
    (tmp_path / "docs.md").write_text(f"run `bench --prompts {SHARED}/eval/prompts.jsonl`\n")
    (tmp_path / "README.md").write_text(f"{SHARED} is named here too\n")
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "run").write_text(f"cp {SHARED}/x .\n")  # CI may read beside the clone
    assert reads_outside(tmp_path) == ["README.md:1", "docs.md:1", "tests/t.py:2"]


def test_nothing_in_the_repo_reads_outside_it():
    assert reads_outside() == []
