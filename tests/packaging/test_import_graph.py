"""The import graph: no cycles between spectune's modules (function-level and type-only imports included), the
feature packages import one way (:data:`helpers.import_graph.PACKAGE_ORDER`, docs/architecture.md "Package order"),
the backend interface depends on no backend, and only installed names import (no checkout folder leaks in under
``spectune.``)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys

import pytest

from helpers.import_graph import (PACKAGE_ORDER, cycles, import_graph, module_files, private_imports,
                                  upward_imports)
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


def test_no_import_cycles_with_type_only_imports():
    """An import under ``if TYPE_CHECKING:`` still ties two modules together (the type-only gain <-> recommend
    pair was one); none closes a cycle either."""
    found = cycles(import_graph(ROOT, type_checking=True))
    assert found == [], "import cycles (type-only imports included):\n" + "\n".join(" -> ".join(c) for c in found)


def test_packages_import_downward():
    """Every import of a feature package (function-level and type-only ones included) points into its own package
    or a lower layer of :data:`PACKAGE_ORDER`: results < measure < tune < sweep.guided < sweep, validate, draft <
    commands < cli; every module of ``spectune/`` belongs to one of those packages."""
    found = upward_imports(ROOT)
    assert found == [], "imports against the package order (docs/architecture.md):\n" + "\n".join(found)


def test_no_package_imports_another_packages_private_name():
    found = private_imports(ROOT)
    assert found == [], "private names imported across packages:\n" + "\n".join(found)


def test_every_package_of_the_order_exists():
    """The order names only packages of the checkout (a renamed package is renamed there too)."""
    modules = module_files(ROOT)
    assert [p for layer in PACKAGE_ORDER for p in layer if p not in modules] == []


def _tree(tmp_path, files):
    for name, text in {"spectune/__init__.py": "", **files}.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text)
    for folder in ("loadgen", "backends", "presets"):
        (tmp_path / folder).mkdir(exist_ok=True)


def test_the_package_order_check_finds_a_type_only_upward_import(tmp_path):
    """A lower package's type-only import of a higher one fails the check, which names the module, its line and
    the import; downward imports and imports inside one package pass."""
    _tree(tmp_path, {
        "spectune/results/point.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                     "    from spectune.tune.recommend import Cell\n",
        "spectune/tune/recommend.py": "from spectune.results import point\nfrom spectune.tune import gain\n",
        "spectune/tune/gain.py": "",
        "spectune/sweep/run.py": "def f():\n    from spectune.validate.plan import ValidatePlan\n",
        "spectune/validate/plan.py": "from spectune.sweep.plan import SweepPlan\n",
        "spectune/sweep/plan.py": "",
    })
    assert upward_imports(tmp_path) == [
        "spectune.results.point:3 imports spectune.tune.recommend (spectune.results -> spectune.tune)",
        "spectune.sweep.run:2 imports spectune.validate.plan (spectune.sweep -> spectune.validate)",
        "spectune.validate.plan:1 imports spectune.sweep.plan (spectune.validate -> spectune.sweep)",
    ]


def test_the_package_order_check_places_every_module(tmp_path):
    """A module outside every package of the order is named (a new package is placed in the order first)."""
    _tree(tmp_path, {"spectune/extra/thing.py": "from spectune.results import point\n",
                     "spectune/results/point.py": ""})
    assert upward_imports(tmp_path) == ["spectune.extra belongs to no package of PACKAGE_ORDER",
                                        "spectune.extra.thing belongs to no package of PACKAGE_ORDER"]


def test_the_private_name_check_finds_a_function_level_import(tmp_path):
    _tree(tmp_path, {"spectune/sweep/display.py": "def f():\n    from spectune.tune.recommend import _cell, Cell\n",
                     "spectune/tune/recommend.py": "from spectune.tune.gain import _band\n",
                     "spectune/tune/gain.py": ""})
    assert private_imports(tmp_path) == ["spectune.sweep.display:2 imports spectune.tune.recommend._cell"]


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_backend_interface_imports_no_backend(graph):
    """``spectune.backends.base`` is what every backend implements: directly or not, it imports only the load
    generator, the shared bottom package (``spectune.core``), its own records (``options``, ``snapshots``) and the
    torch-free reading of a draft head's EAGLE version (and the one head-config reader it uses), never a backend."""
    reached = _reach(graph, "spectune.backends.base")
    assert sorted(t for t in reached if not t.startswith(("spectune.loadgen.", "spectune.core."))) == [
        "spectune.backends.eagle_heads", "spectune.backends.head_config", "spectune.backends.options",
        "spectune.backends.snapshots"]


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


def test_the_registry_imports_no_backend_until_one_is_chosen():
    """``import spectune.backends`` loads the interface and its records, no backend's package or module: the
    registry names backends, and :func:`spectune.backends.make_backend` imports the one chosen."""
    code = ("import sys, spectune.backends as b; "
            "print(sorted(m for m in sys.modules if m.startswith('spectune.backends.'))); "
            "b.backend_class('openai'); print('spectune.backends.openai' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    loaded = ast.literal_eval(out[0])
    assert set(loaded) <= {"spectune.backends.base", "spectune.backends.options", "spectune.backends.snapshots",
                           "spectune.backends.eagle_heads", "spectune.backends.head_config"}, loaded
    assert out[1] == "True"
