"""The house plan: one installed import name, the import rules between packages, and a wheel that carries every
module. docs/architecture.md states the rules these tests hold the code to."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from helpers.import_graph import FOLDERS
from helpers.paths import ROOT

OLD_TOP_LEVEL = ("loadgen", "backends", "presets")


def _modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def _imports(path: Path) -> list[str]:
    """Absolute module names imported anywhere in ``path`` (top level and inside functions)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
    return names


def _violations(folder: str, allowed: tuple[str, ...]) -> list[str]:
    bad = []
    for path in _modules(folder):
        for name in _imports(path):
            if name.startswith("spectune.") and not name.startswith(allowed):  # `import spectune`: __version__
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_loadgen_imports_nothing_of_spectune_above_it():
    assert _violations("loadgen", ("spectune.loadgen", "spectune.core")) == []


def test_backends_import_only_backends_and_loadgen():
    assert _violations("backends", ("spectune.backends", "spectune.loadgen", "spectune.core")) == []


def test_core_imports_nothing_of_spectune():
    """``spectune.core`` (the one user error, the JSON types) lies below every layer: it imports nothing of spectune."""
    assert _violations("spectune/core", ("spectune.core",)) == []


def test_presets_import_only_loadgen():
    assert _violations("presets", ("spectune.presets", "spectune.loadgen", "spectune.core")) == []


MAX_MODULE_LINES = 600
"""Issue 31: no module of the installed package over this many lines (split it by concern instead)."""


@pytest.mark.parametrize("folder", FOLDERS)
def test_no_module_over_the_line_limit(folder):
    long = {str(p.relative_to(ROOT)): n for p in _modules(folder)
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_feature_packages_never_import_the_cli():
    features = [p for p in (ROOT / "spectune").iterdir() if p.is_dir() and p.name not in ("commands", "__pycache__")]
    bad = [v for f in features for v in _violations(f"spectune/{f.name}", ("spectune.backends", "spectune.loadgen",
                                                                            "spectune.presets", "spectune.measure",
                                                                            "spectune.results", "spectune.sweep",
                                                                            "spectune.validate", "spectune.tune",
                                                                            "spectune.draft", "spectune.core"))]
    assert bad == []


@pytest.mark.parametrize("folder", ["spectune", "loadgen", "backends", "presets", "tests", "benchmarks"])
def test_one_import_spelling(folder):
    """Nothing imports the subsystems under their folder names (``import backends``): they install under spectune."""
    bad = [f"{p.relative_to(ROOT)} imports {n}" for p in _modules(folder) for n in _imports(p)
           if n.split(".")[0] in OLD_TOP_LEVEL]
    assert bad == []


@pytest.fixture(scope="module")
def wheel_build(tmp_path_factory) -> tuple[Path, str]:
    """spectune's wheel, built by setuptools (PEP 517 ``build_wheel``) from a copy of the source tree, and the
    build's stderr."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("dist")
    code = f"from setuptools import build_meta; print(build_meta.build_wheel({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out / proc.stdout.strip().splitlines()[-1], proc.stderr


@pytest.fixture(scope="module")
def wheel(wheel_build) -> Path:
    return wheel_build[0]


def test_every_folder_with_files_is_a_listed_package(wheel_build):
    """setuptools names folders it would ship but that pyproject.toml does not list (the bundled head's folder was
    one): the package list is complete."""
    assert "absent from the `packages` configuration" not in wheel_build[1]


def test_the_wheel_installs_one_import_name(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"spectune"}


def test_the_wheel_holds_every_module(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {FOLDERS[folder].replace(".", "/") + "/" + str(p.relative_to(ROOT / folder))
                for folder in FOLDERS for p in _modules(folder)}
    assert sorted(expected - names) == []


def test_the_wheel_holds_the_bundled_head_and_the_presets(wheel):
    """Every file under heads/ (the EAGLE-3 head and its acceptance head in a subfolder) and every preset."""
    names = set(zipfile.ZipFile(wheel).namelist())
    heads = ROOT / "backends" / "local" / "heads"
    data = {f"spectune/backends/local/heads/{p.relative_to(heads).as_posix()}"
            for p in heads.rglob("*") if p.is_file() and "__pycache__" not in p.parts} | \
           {f"spectune/presets/{p.name}" for p in (ROOT / "presets").glob("*.json")}
    assert sorted(data - names) == []
