"""The llama.cpp runtime's parts that need no llama.cpp: its thread count is torch's default one, and torch enters
its modules only to hand the logits over."""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest
import torch

from engine.backends.llama_cpp import GgufSettings, physical_cores

BACKENDS = Path(__file__).resolve().parents[2] / "engine" / "backends"


def _cpu(root: Path, cpu: int, package: int, core: int) -> None:
    topology = root / f"cpu{cpu}" / "topology"
    topology.mkdir(parents=True)
    (topology / "physical_package_id").write_text(f"{package}\n")
    (topology / "core_id").write_text(f"{core}\n")


def test_physical_cores_count_a_cores_hardware_threads_once(tmp_path):
    """Two packages of two cores, two hardware threads each: 8 logical CPUs, 4 cores (core ids repeat per
    package)."""
    for cpu in range(8):
        _cpu(tmp_path, cpu, package=cpu // 4, core=(cpu % 4) // 2)
    (tmp_path / "cpufreq").mkdir()  # not a CPU
    assert physical_cores(tmp_path) == 4


def test_without_a_topology_every_logical_cpu_counts(tmp_path):
    assert physical_cores(tmp_path) == (os.cpu_count() or 1)


def test_the_default_thread_count_is_torchs(monkeypatch):
    """``GgufSettings.threads`` None means the physical cores: the count torch starts with where neither
    OMP_NUM_THREADS nor MKL_NUM_THREADS chooses another."""
    if os.environ.get("OMP_NUM_THREADS") or os.environ.get("MKL_NUM_THREADS"):
        pytest.skip("the environment sets torch's thread count")
    assert GgufSettings().threads is None
    assert physical_cores() == torch.get_num_threads()


def annotations(tree: ast.AST) -> set[int]:
    """The nodes inside type annotations (strings at run time, under ``from __future__ import annotations``)."""
    roots = [node.annotation for node in ast.walk(tree)
             if isinstance(node, (ast.arg, ast.AnnAssign)) and node.annotation]
    roots += [node.returns for node in ast.walk(tree) if isinstance(node, ast.FunctionDef) and node.returns]
    return {id(inner) for root in roots for inner in ast.walk(root)}


def torch_uses(path: Path) -> list[str]:
    """Each use of torch in a module's code: ``import torch`` / ``from torch ...`` and each ``torch.x`` read outside
    type annotations."""
    tree = ast.parse(path.read_text())
    typing_only = annotations(tree)
    found = [f"import {a.name}" for node in ast.walk(tree) if isinstance(node, ast.Import)
             for a in node.names if a.name.split(".")[0] == "torch"]
    found += [f"from {node.module}" for node in ast.walk(tree)
              if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch"]
    return found + [f"torch.{node.attr}" for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                    and isinstance(node.value, ast.Name) and node.value.id == "torch" and id(node) not in typing_only]


def test_llama_cpp_needs_torch_only_for_the_logits_hand_over():
    assert torch_uses(BACKENDS / "llama_cpp.py") == []
    assert torch_uses(BACKENDS / "llama_cpp_runner.py") == ["import torch", "torch.from_numpy"]
