"""spectune's module import graph, read from the source with :mod:`ast`, and its cycles.

Every ``import`` and ``from ... import`` of a spectune module counts, at module level and inside functions alike
(a function-level import that closes a cycle still makes the two modules depend on each other); imports under
``if TYPE_CHECKING:`` do not (they never run). Relative imports are resolved against the importing module's
package. ``from package import name`` is an edge to ``package.name`` when that is a module, else to ``package``.
Importing a submodule also runs its parents' ``__init__``; those implicit edges are not drawn (as in pydeps and
import-linter), so a package's ``__init__`` re-exporting its modules is no cycle.

Run as a script (``python tests/helpers/import_graph.py [ROOT]``) it prints the cycles of the checkout at ROOT.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

FOLDERS = {"spectune": "spectune", "loadgen": "spectune.loadgen", "backends": "spectune.backends",
           "presets": "spectune.presets"}
"""Source folder -> the package it installs as (pyproject.toml ``package-dir``)."""


def module_files(root: Path) -> dict[str, Path]:
    """Installed module name -> source file, for every ``.py`` under the four source folders of ``root``."""
    found = {}
    for folder, package in FOLDERS.items():
        for path in sorted((root / folder).rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join([package, *parts])] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Import statements anywhere in ``tree`` except under ``if TYPE_CHECKING:``."""
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The spectune modules that module ``name`` (source ``path``) imports at run time."""
    is_package = path.name == "__init__.py"
    targets: set[str] = set()
    for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "spectune":
                    targets.add(_nearest(alias.name, modules) or alias.name)
            continue
        if node.level:
            base = name if is_package else name.rpartition(".")[0]
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            module = f"{base}.{node.module}" if node.module else base
        else:
            module = node.module or ""
        if module.split(".")[0] != "spectune":
            continue
        for alias in node.names:
            candidate = f"{module}.{alias.name}"
            targets.add(candidate if candidate in modules else (_nearest(module, modules) or module))
    targets.discard(name)
    return {t for t in targets if t in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the spectune modules it imports, for the checkout at ``root``."""
    modules = module_files(root)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) per strongly connected component of more than one module (Tarjan's
    algorithm), sorted; empty when the graph has no cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph) + 100))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(_one_cycle(graph, component) for component in components)


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """The shortest cycle through the component's first module (breadth-first search inside the component)."""
    start = min(component)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if w not in previous:
                    previous[w] = v
                    following.append(w)
        frontier = following
    return [start]


if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2])
    found = cycles(import_graph(root))
    print(f"{len(found)} import cycle(s) in {root}")
    for cycle in found:
        print("  " + " -> ".join(cycle))
