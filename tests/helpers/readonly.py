"""Make a directory really read-only for this process, even as root (tests of read-only setups).

Root ignores permission bits, so ``chmod`` proves nothing there. As root, every folder and file under the
directory gets the immutable flag (``chattr +i``: nobody, root included, may create, change, rename or delete
them); any other user gets ``chmod a-w``. Symbolic links are left alone (and never followed). When neither
works (a file system without the flag), the test is skipped with the reason.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


def _paths(root: Path) -> list[str]:
    """root and every folder and regular file under it, links excluded."""
    found = [str(root)]
    for dirpath, dirnames, filenames in os.walk(root):
        found += [os.path.join(dirpath, n) for n in dirnames + filenames
                  if not os.path.islink(os.path.join(dirpath, n))]
    return found


def _chattr(flag: str, paths: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(["chattr", flag, *paths], capture_output=True, text=True)


def _writable(root: Path) -> bool:
    try:
        with tempfile.TemporaryFile(dir=root):
            return True
    except OSError:
        return False


@contextmanager
def read_only(root: Path) -> Iterator[None]:
    """Within the block, nothing under ``root`` can be created, changed, renamed or deleted by this process."""
    root = Path(root)
    paths = _paths(root)
    if os.geteuid() == 0:
        if shutil.which("chattr") is None:
            pytest.skip("cannot make a directory read-only here: running as root (which ignores permissions) "
                        "and chattr is not installed")
        made = _chattr("+i", paths)
        if made.returncode != 0:
            _chattr("-i", paths)
            pytest.skip("cannot make a directory read-only here: running as root (which ignores permissions) "
                        f"and chattr +i failed: {made.stderr.strip()}")
        undo = lambda: _chattr("-i", paths)  # noqa: E731
    else:
        modes = {p: os.stat(p).st_mode for p in paths}
        for p, mode in modes.items():
            os.chmod(p, mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

        def undo():
            for p, mode in modes.items():
                os.chmod(p, mode)
    try:
        assert not _writable(root), f"{root} is still writable: the read-only test would prove nothing"
        yield
    finally:
        undo()
