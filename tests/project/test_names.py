"""One meaning per name: a token kind is never a model's role, no engine module shares its name with an engine
package, and ``calibrate`` names one thing only (the cache judge's thresholds, ``bench.cache.calibrate``)."""
from __future__ import annotations

import ast
from pathlib import Path

from engine.events import TOKEN_KINDS
from engine.serve.pair_slot import PAIR_ROLES

REPO = Path(__file__).resolve().parents[2]
ENGINE = REPO / "engine"


def test_no_token_kind_is_a_model_role():
    assert not set(TOKEN_KINDS) & set(PAIR_ROLES), "a token kind named like a model reads as 'made by that model'"


def package_clashes(root: Path) -> list[str]:
    """Modules below ``root``'s packages named like one of ``root``'s own packages (``cache/backends.py``
    beside ``backends/``)."""
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    return sorted(str(m.relative_to(root)) for m in root.glob("*/**/*.py") if m.stem in packages)


def test_the_clash_check_sees_a_module_named_like_a_package(tmp_path):
    for package in ("backends", "cache"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "cache" / "backends.py").write_text("")
    assert package_clashes(tmp_path) == ["cache/backends.py"]


def test_no_engine_module_is_named_like_an_engine_package():
    assert package_clashes(ENGINE) == []


def test_calibrate_names_only_the_judges_thresholds():
    named = [f"{path.relative_to(REPO)}:{node.name}" for path in ENGINE.rglob("*.py")
             for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.FunctionDef | ast.ClassDef)
             and node.name == "calibrate"]
    assert named == [] and not list(ENGINE.rglob("calibrate.py"))
