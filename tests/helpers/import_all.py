"""Import every named module and check that each came from the install folder, not from the source tree.

``python tests/helpers/import_all.py SITE MODULE...`` (tests/project/test_layout.py): run by its path, from a
folder outside the repository, with only SITE on PYTHONPATH, so the source tree is not on ``sys.path``.
"""
from __future__ import annotations

import importlib
import sys


def main(site: str, modules: list[str]) -> None:
    outside = [m for m in modules if not importlib.import_module(m).__file__.startswith(site)]
    assert not outside, f"not installed, imported from the source tree instead: {outside}"


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
