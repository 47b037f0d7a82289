"""spectune's module import graph, read from the source with :mod:`ast`, and its cycles.

Every ``import`` and ``from ... import`` of a spectune module counts, at module level and inside functions alike
(a function-level import that closes a cycle still makes the two modules depend on each other); imports under
``if TYPE_CHECKING:`` do not (they never run). Relative imports are resolved against the importing module's
package. ``from package import name`` is an edge to ``package.name`` when that is a module, else to ``package``.
Importing a submodule also runs its parents' ``__init__``; those implicit edges are not drawn (as in pydeps and
import-linter), so a package's ``__init__`` re-exporting its modules is no cycle.

With ``type_checking=True`` the imports under ``if TYPE_CHECKING:`` count as well: a type-only import still makes
one module know the other, so the package order (:data:`PACKAGE_ORDER`, :func:`upward_imports`) reads that graph.

Run as a script (``python tests/helpers/import_graph.py [ROOT]``) it prints the cycles of the checkout at ROOT
(type-only imports included), the imports that run against :data:`PACKAGE_ORDER` and the private names imported
across its packages.
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


def _runtime_imports(tree: ast.AST, type_checking: bool = False) -> list[ast.Import | ast.ImportFrom]:
    """Import statements anywhere in ``tree`` except under ``if TYPE_CHECKING:`` (those too with
    ``type_checking``)."""
    out: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        if not type_checking and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))
    return out


def _nearest(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _from_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The module a ``from ... import`` in module ``name`` reads from, relative imports resolved."""
    if not node.level:
        return node.module or ""
    base = name if is_package else name.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    return f"{base}.{node.module}" if node.module else base


def located_imports(name: str, path: Path, modules: dict[str, Path],
                    type_checking: bool = False) -> list[tuple[str, int]]:
    """(imported spectune module, line) for every import of module ``name`` (source ``path``), sorted; type-only
    imports too with ``type_checking``."""
    is_package = path.name == "__init__.py"
    found: set[tuple[str, int]] = set()
    for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8")), type_checking):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "spectune":
                    found.add((_nearest(alias.name, modules) or alias.name, node.lineno))
            continue
        module = _from_module(node, name, is_package)
        if module.split(".")[0] != "spectune":
            continue
        for alias in node.names:
            candidate = f"{module}.{alias.name}"
            found.add((candidate if candidate in modules else (_nearest(module, modules) or module), node.lineno))
    return sorted((t, line) for t, line in found if t != name and t in modules)


def imports_of(name: str, path: Path, modules: dict[str, Path], type_checking: bool = False) -> set[str]:
    """The spectune modules that module ``name`` (source ``path``) imports at run time (and under ``if
    TYPE_CHECKING:`` with ``type_checking``)."""
    return {t for t, _ in located_imports(name, path, modules, type_checking)}


def import_graph(root: Path, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the spectune modules it imports, for the checkout at ``root`` (type-only imports too with
    ``type_checking``)."""
    modules = module_files(root)
    return {name: imports_of(name, path, modules, type_checking) for name, path in modules.items()}


PACKAGE_ORDER: list[tuple[str, ...]] = [
    ("spectune.cli",),
    ("spectune.commands",),
    ("spectune.sweep", "spectune.validate", "spectune.draft"),
    ("spectune.sweep.guided",),
    ("spectune.tune",),
    ("spectune.measure",),
    ("spectune.results",),
    ("spectune",),
]
"""The layers of ``spectune/``'s own packages, highest first (docs/architecture.md, "Package order"): a module
imports only from its own package and from packages of lower layers; the packages of one layer do not import each
other. ``spectune`` is the package's own ``__init__``; ``spectune.backends``, ``spectune.loadgen`` and
``spectune.presets`` lie below all of them, and ``spectune.core`` below those (tests/packaging/test_layout.py)."""

BELOW = ("spectune.backends", "spectune.loadgen", "spectune.presets", "spectune.core")
"""The subpackages below every layer of :data:`PACKAGE_ORDER`."""


def package_of(module: str) -> str | None:
    """The package of :data:`PACKAGE_ORDER` that ``module`` belongs to (the longest that contains it; ``spectune``
    holds only its own ``__init__``), or None for the modules below them (:data:`BELOW`) and for a module of none
    of them."""
    if any(module == b or module.startswith(b + ".") for b in BELOW):
        return None
    names = [p for layer in PACKAGE_ORDER for p in layer]
    return max((p for p in names if module == p or (p != "spectune" and module.startswith(p + "."))), key=len,
               default=None)


def _layer(package: str) -> int:
    return next(i for i, layer in enumerate(PACKAGE_ORDER) if package in layer)


def upward_imports(root: Path) -> list[str]:
    """Every import, type-only and function-level ones included, that runs against :data:`PACKAGE_ORDER` in the
    checkout at ``root``: into a higher layer's package or into another package of the same layer, as
    ``"module:line imports target (package -> package)"``, sorted; also every module that belongs to no package of
    the order (a new package is placed in it first)."""
    modules = module_files(root)
    out = []
    for name, path in sorted(modules.items()):
        source = package_of(name)
        if source is None:
            if not any(name == b or name.startswith(b + ".") for b in BELOW):
                out.append(f"{name} belongs to no package of PACKAGE_ORDER")
            continue
        for target, line in located_imports(name, path, modules, type_checking=True):
            dest = package_of(target)
            if dest is None or dest == source:
                continue
            if _layer(dest) <= _layer(source):
                out.append(f"{name}:{line} imports {target} ({source} -> {dest})")
    return out


def private_imports(root: Path) -> list[str]:
    """Every ``from module import _name`` (type-only and function-level ones included) of a private name from
    another package of :data:`PACKAGE_ORDER`, as ``"module:line imports target._name"``, sorted: a helper two
    packages share is public (or moves down)."""
    modules = module_files(root)
    out = []
    for name, path in sorted(modules.items()):
        source = package_of(name)
        for node in _runtime_imports(ast.parse(path.read_text(encoding="utf-8")), type_checking=True):
            if not isinstance(node, ast.ImportFrom):
                continue
            module = _from_module(node, name, path.name == "__init__.py")
            if module.split(".")[0] != "spectune" or package_of(module) == source:
                continue
            out += sorted(f"{name}:{node.lineno} imports {module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__"))
    return sorted(out)


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
    found = cycles(import_graph(root, type_checking=True))
    print(f"{len(found)} import cycle(s) in {root} (type-only imports included)")
    for cycle in found:
        print("  " + " -> ".join(cycle))
    against = upward_imports(root)
    print(f"{len(against)} import(s) against the package order")
    for line in against:
        print("  " + line)
    private = private_imports(root)
    print(f"{len(private)} import(s) of another package's private name")
    for line in private:
        print("  " + line)
