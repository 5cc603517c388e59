"""The repository's import graph, read from the source (no module is imported): every `import` and
`from ... import` statement of every module under services/, shared/, kernels/ and bench/,
module-level and function-level alike (an import inside a function is as much a dependency as
one at the top; only the time it runs differs). Imports under `if TYPE_CHECKING:` are kept and
marked, since they never run.

`from a.b import c` is an edge to `a.b.c` when that is a module of the repository, else to `a.b`;
relative imports are resolved against the importing module's package. Edges to modules outside
the repository (torch, xgrammar, ...) are dropped."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("services", "shared", "kernels", "bench")


@dataclass(frozen=True)
class Edge:
    source: str  # the importing module, dotted
    target: str  # the imported module of the repository, dotted
    line: int
    function_level: bool  # inside a def (runs when called)
    type_checking: bool  # under `if TYPE_CHECKING:` (never runs)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@lru_cache(maxsize=1)
def modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the scanned packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            out[module_name(path)] = path
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.Module):
    """(node, function_level, type_checking) for every import statement of `tree`."""
    def visit(node: ast.AST, in_def: bool, in_tc: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, in_def, in_tc
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from visit(child, True, in_tc)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_def, True)
                for stmt in child.orelse:
                    yield from visit(ast.Module(body=[stmt], type_ignores=[]), in_def, in_tc)
            else:
                yield from visit(child, in_def, in_tc)
    yield from visit(tree, False, False)


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest prefix of dotted `name` that is a known module."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in known:
            return candidate
        parts.pop()
    return None


@lru_cache(maxsize=1)
def edges() -> tuple[Edge, ...]:
    known = modules()
    out = []
    for name, path in known.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_def, in_tc in _imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    package = name.split(".") if is_package else name.split(".")[:-1]
                    package = package[:len(package) - (node.level - 1)]
                    base = ".".join(package + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
            for target in targets:
                resolved = _resolve(target, known)
                if resolved is not None and resolved != name:
                    out.append(Edge(name, resolved, node.lineno, in_def, in_tc))
    return tuple(out)


def graph(*, runtime_only: bool = True) -> dict[str, set[str]]:
    """Module -> the modules it imports (without TYPE_CHECKING imports when `runtime_only`)."""
    out: dict[str, set[str]] = {m: set() for m in modules()}
    for e in edges():
        if not (runtime_only and e.type_checking):
            out[e.source].add(e.target)
    return out


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `g` with more than one node (Tarjan), each sorted;
    a component is one cycle or several that share modules."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    for root in sorted(g):
        if root in index:
            continue
        work = [(root, iter(sorted(g[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(g.get(child, ())))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


@lru_cache(maxsize=1)
def _packages_with_folders() -> frozenset[str]:
    """Packages that hold sub-packages beside their modules (services.grammar: cache/, ...)."""
    return frozenset(m.rpartition(".")[0] for m, path in modules().items()
                     if path.name == "__init__.py" and "." in m)


def room(module: str) -> str:
    """The room a module lives in: its folder (services.grammar.cache for
    services.grammar.cache.store), except that a module beside sub-folders is a room of its own
    (services.grammar.compiler beside cache/ and engines/; services.settings; shared.errors):
    the folders and such modules are the peers the layout names."""
    path = modules()[module]
    if path.name == "__init__.py":
        return module
    package = module.rpartition(".")[0]
    return module if package in _packages_with_folders() else package


def room_edges() -> dict[tuple[str, str], list[Edge]]:
    """(room, room) -> the runtime import edges between their modules."""
    out: dict[tuple[str, str], list[Edge]] = {}
    for e in edges():
        src, dst = room(e.source), room(e.target)
        if src != dst and not e.type_checking:
            out.setdefault((src, dst), []).append(e)
    return out


def room_graph() -> dict[str, set[str]]:
    """Room -> the rooms its modules import (runtime imports only)."""
    out: dict[str, set[str]] = {room(m): set() for m in modules()}
    for src, dst in room_edges():
        out[src].add(dst)
    return out
