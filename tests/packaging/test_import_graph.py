"""The import graph: no cycles between spectune's modules (function-level imports included), the backend interface
depends on no backend, and only installed names import (no checkout folder leaks in under ``spectune.``)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from helpers.import_graph import cycles, import_graph
from helpers.paths import ROOT


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT)


def test_the_graph_reads_the_imports(graph):
    """The reader sees arrows into every subsystem folder (what the old ``__path__`` append hid from it)."""
    targets = {t for ts in graph.values() for t in ts}
    for package in ("spectune.loadgen", "spectune.backends", "spectune.results"):
        assert any(t.startswith(package + ".") for t in targets), package


def test_no_import_cycles(graph):
    found = cycles(graph)
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_function_level_cycle(tmp_path):
    """A cycle closed by an import inside a function counts (the check above can fail)."""
    pkg = tmp_path / "spectune"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from spectune.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from spectune import a\n")
    for folder in ("loadgen", "backends", "presets"):
        (tmp_path / folder).mkdir()
    assert cycles(import_graph(tmp_path)) == [["spectune.a", "spectune.b", "spectune.a"]]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_backend_interface_imports_no_backend(graph):
    """``spectune.backends.base`` is what every backend implements: directly or not, it imports only the load
    generator and the torch-free reading of a draft head's EAGLE version (and the one head-config reader it uses),
    never a backend."""
    reached = _reach(graph, "spectune.backends.base")
    assert sorted(t for t in reached if not t.startswith("spectune.loadgen.")) == ["spectune.backends.eagle_heads",
                                                                                    "spectune.backends.head_config"]


@pytest.mark.parametrize("name", ["spectune.tests", "spectune.docs", "spectune.benchmarks", "spectune.spectune"])
def test_checkout_folders_are_not_spectune_modules(name):
    assert importlib.util.find_spec(name) is None


def test_the_cli_starts_without_heavy_packages():
    """``spectune --help`` imports every command module; none may pull in a heavy package at import time."""
    heavy = ("torch", "transformers", "pandas", "numpy", "matplotlib", "aiohttp", "pydantic", "safetensors", "gguf")
    code = ("import sys, spectune.cli; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
