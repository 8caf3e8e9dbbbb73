"""The folders show the layers: no import circles, no package importing one above it, a small engine root,
and a package list in pyproject.toml that matches the tree (a non-editable install must ship every module)."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("engine", "app", "bench")

# Bottom to top. A module may import its own layer or any layer below it, never one above.
LAYERS = (
    "engine.errors",
    "engine.precision",  # one record per precision: what it is, where it runs, its rounding and tie rule
    "engine.config",
    "engine.costs",  # the cost model and the k policy: pure Python
    "engine.events",
    "engine.backends",  # the runtimes behind one runner contract: torch, llama.cpp
    "engine.decode",  # the loop, verify, sampling, runner, stream, reference, the Draft/Proposer contract
    "engine.proposers",
    "engine.models",  # loading, catalog, hardware, quantised layers, calibration, the chat prompt, runner_for
    "engine.start",  # one way to start a decode: runners, proposers, the k policy, the stream (chat, lab, bench)
    "engine.cache",
    "engine.divergence",
    "engine.lab",  # experiments: grids, their runner, the pair doctor (engine.lab.grid and .results: pure)
    "engine.surface",  # the Protocol the app calls, and the values it returns
    "engine.serve",  # the facade's parts: the pair slot, the model lock, generation, the proofs
    "engine.chat_engine",  # ChatEngine: the one implementation of engine.surface, a thin facade over engine.serve
    "app",
    "bench",  # command-line tools: they measure the engine and the app
    "launch",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    found = {module_name(p): p for top in SOURCES for p in (REPO / top).rglob("*.py")}
    found["launch"] = REPO / "launch.py"
    return found


def imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules imported anywhere in ``path``, lazy imports included (``from a.b import c`` counts as
    a.b.c when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def layer(module: str) -> int:
    matches = [i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + ".")]
    assert matches, f"{module} is in no layer: add it to LAYERS"
    return max(matches)


def graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {m: imports(p, set(modules)) - {m} for m, p in modules.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    assert cycles(graph()) == []


def test_no_package_imports_one_above_it():
    wrong = [f"{m} -> {d}" for m, deps in graph().items() for d in deps if layer(d) > layer(m)]
    assert wrong == []


def test_engine_root_is_small_and_app_stays_out_of_engine():
    root = sorted(p.name for p in (REPO / "engine").glob("*.py"))
    assert len(root) <= 8, root
    edges = graph()
    assert not [m for m, deps in edges.items() if m.startswith("engine") and any(d.startswith(("app", "bench"))
                                                                                  for d in deps)]


def test_pyproject_lists_every_package():
    """setuptools installs only the listed packages: a missing one works editable and breaks a real install."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {module_name(p) for top in SOURCES for p in (REPO / top).rglob("__init__.py")}
    assert listed == on_disk
    for top in SOURCES:
        for folder in (REPO / top).rglob("*"):
            if folder.is_dir() and folder.name != "__pycache__" and any(folder.glob("*.py")):
                assert (folder / "__init__.py").exists(), f"{folder} has modules but no __init__.py"


_IMPORT_ALL = """
import importlib, sys
target = sys.argv[1]
outside = [m for m in sys.argv[2:] if not importlib.import_module(m).__file__.startswith(target)]
assert not outside, f"not installed, imported from the source tree instead: {outside}"
"""


@pytest.mark.real  # builds a wheel: slow for the fast tier
def test_a_non_editable_install_ships_every_module(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(REPO)],
                   check=True, capture_output=True, text=True)
    modules = sorted(m for m in project_modules() if m != "launch")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL, str(site), *modules], cwd=tmp_path, env=env,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]


# -- sizes a newcomer can read: a file on a few screens, a function on one, a thin facade ---------------------
MAX_FILE_LINES = 300
MAX_FUNCTION_LINES = 50
MAX_CHAT_ENGINE_LINES = 120


def source_files() -> list[Path]:
    """Every Python file outside tests/ that the project ships or runs (engine, app, bench, scripts, launch.py)."""
    return sorted([*(p for top in (*SOURCES, "scripts") for p in (REPO / top).rglob("*.py")), REPO / "launch.py"])


def long_functions(path: Path, limit: int, root: Path = REPO) -> list[str]:
    """``file:line name (n lines)`` for each function or method in ``path`` longer than ``limit`` lines, its
    decorators and docstring included."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            n = node.end_lineno - start + 1
            if n > limit:
                found.append(f"{path.relative_to(root)}:{start} {node.name} ({n} lines)")
    return found


def test_the_size_checks_see_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(60))
    (tmp_path / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}\n")
    assert long_functions(tmp_path / "m.py", MAX_FUNCTION_LINES, root=tmp_path) == ["m.py:5 long (61 lines)"]


def test_no_file_over_300_lines_outside_tests():
    big = [f"{p.relative_to(REPO)} ({n})" for p in source_files()
           if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES]
    assert big == []


def test_no_function_over_50_lines_outside_tests():
    assert [f for p in source_files() for f in long_functions(p, MAX_FUNCTION_LINES)] == []


def test_chat_engine_is_a_thin_facade():
    tree = ast.parse((REPO / "engine" / "chat_engine.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChatEngine")
    assert engine.end_lineno - engine.lineno + 1 <= MAX_CHAT_ENGINE_LINES


def test_the_readme_is_a_tour():
    assert len((REPO / "README.md").read_text().splitlines()) <= 350
