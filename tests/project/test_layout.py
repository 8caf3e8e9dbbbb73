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
    "engine.costs",  # the cost model: pure Python
    "engine.events",
    "engine.backends",  # the runtimes behind one runner contract: torch, llama.cpp
    "engine.decode",  # the loop, its step budget and k policy, verify, sampling, stream, reference, Draft/Proposer
    "engine.proposers",
    "engine.models",  # loading, catalog, hardware, quantised layers, load-time checks, the chat prompt, runner_for
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


# What the app may import from the engine: the surface (the Protocol, its values and the re-exports the app
# builds from), the settings (validated once, where they are defined), and the errors and events it renders.
APP_MAY_IMPORT = ("engine.surface", "engine.config", "engine.errors", "engine.events")


def engine_imports(path: Path) -> set[str]:
    """The engine modules ``path`` imports, lazy imports included (``from engine import x`` counts as engine.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"engine.{a.name}" for a in node.names} if node.module == "engine" else {node.module}
    return {name for name in found if name == "engine" or name.startswith("engine.")}


def imports_past_the_surface(root: Path = REPO) -> list[str]:
    """``file: module`` for each engine module a file under ``root``/app imports that is not in APP_MAY_IMPORT."""
    return [f"{p.relative_to(root)}: {m}" for p in sorted((root / "app").rglob("*.py"))
            for m in sorted(engine_imports(p)) if m not in APP_MAY_IMPORT]


def test_the_surface_check_sees_an_app_module_importing_past_it(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "tab.py").write_text(
        "from engine.surface import EngineSurface\nfrom engine.errors import EngineError\n"
        "from engine.lab.grid import ExperimentGrid\n\n\ndef lazy():\n    import engine.cache.store\n"
        "    from engine import chat_engine\n")
    assert imports_past_the_surface(tmp_path) == ["app/tab.py: engine.cache.store", "app/tab.py: engine.chat_engine",
                                                  "app/tab.py: engine.lab.grid"]


def test_the_app_imports_the_engine_only_through_its_allow_list():
    assert imports_past_the_surface() == []


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


@pytest.mark.real  # builds a wheel: slow for the fast tier
def test_a_non_editable_install_ships_every_module(tmp_path):
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(site), str(REPO)],
                   check=True, capture_output=True, text=True)
    modules = sorted(m for m in project_modules() if m != "launch")
    env = {**os.environ, "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, str(REPO / "tests" / "helpers" / "import_all.py"), str(site), *modules],
                            cwd=tmp_path, env=env, capture_output=True, text=True)
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


def long_files(paths: list[Path], limit: int, root: Path = REPO) -> list[str]:
    """``file (n)`` for each of ``paths`` longer than ``limit`` lines."""
    return [f"{p.relative_to(root)} ({n})" for p in paths if (n := len(p.read_text().splitlines())) > limit]


def test_the_size_checks_see_a_long_file(tmp_path):
    for name, n in (("at_limit.py", MAX_FILE_LINES), ("over.py", MAX_FILE_LINES + 1)):
        (tmp_path / name).write_text("".join(f"x{i} = {i}\n" for i in range(n)))
    paths = sorted(tmp_path.glob("*.py"))
    assert long_files(paths, MAX_FILE_LINES, root=tmp_path) == [f"over.py ({MAX_FILE_LINES + 1})"]


def test_no_file_over_300_lines_outside_tests():
    assert long_files(source_files(), MAX_FILE_LINES) == []


def test_no_function_over_50_lines_outside_tests():
    assert [f for p in source_files() for f in long_functions(p, MAX_FUNCTION_LINES)] == []


def test_chat_engine_is_a_thin_facade():
    tree = ast.parse((REPO / "engine" / "chat_engine.py").read_text())
    engine = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ChatEngine")
    assert engine.end_lineno - engine.lineno + 1 <= MAX_CHAT_ENGINE_LINES


def test_the_readme_is_a_tour():
    assert len((REPO / "README.md").read_text().splitlines()) <= 350


# -- the tests: what they share lives in tests/helpers, and a test is code, not a string run in a subprocess --
def imports_of_test_modules(root: Path = REPO) -> list[str]:
    """``file: module`` for each import, anywhere under ``root``/tests, of a test module (``test_*``); relative
    imports and lazy ones included."""
    found = []
    for path in sorted((root / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = [module, *(f"{module.rstrip('.')}.{a.name}" for a in node.names)]
            else:
                continue
            found += [f"{path.relative_to(root)}: {n}" for n in dict.fromkeys(names)
                      if any(part.startswith("test_") for part in n.split("."))]
    return found


INTERPRETERS = ("sys.executable", "'python'", "'python3'")


def code_strings_run(root: Path = REPO) -> list[str]:
    """``file:line`` for each interpreter command under ``root``/tests (a list starting with ``sys.executable``)
    that is handed code as a string (``-c``). A helper module run with ``python -m tests.helpers.NAME`` is read,
    checked and imported like the rest."""
    return [f"{path.relative_to(root)}:{node.lineno}" for path in sorted((root / "tests").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.List, ast.Tuple)) and node.elts and ast.unparse(node.elts[0]) in INTERPRETERS
            and any(isinstance(e, ast.Constant) and e.value == "-c" for e in node.elts[1:])]


def test_the_test_checks_see_a_test_importing_a_test_and_a_code_string(tmp_path):
    (tmp_path / "tests" / "cache").mkdir(parents=True)
    (tmp_path / "tests" / "cache" / "test_b.py").write_text(
        "import subprocess, sys\nfrom tests.helpers.constants import SMOL\nfrom tests.cache.test_a import SCOPE\n\n\n"
        "def test_b():\n    from .test_a import Embedder\n    subprocess.run([sys.executable, \"-c\", \"pass\"])\n")
    found = ["tests.cache.test_a", "tests.cache.test_a.SCOPE", ".test_a", ".test_a.Embedder"]
    assert imports_of_test_modules(tmp_path) == [f"tests/cache/test_b.py: {name}" for name in found]
    assert code_strings_run(tmp_path) == ["tests/cache/test_b.py:8"]


def test_no_test_module_imports_another():
    assert imports_of_test_modules() == []


def test_no_test_runs_code_from_a_string():
    assert code_strings_run() == []
