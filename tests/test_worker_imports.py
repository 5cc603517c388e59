"""The worker's rooms import each other one way only (DESIGN.md, "Worker layout": "no import
cycles"; the speculation room: the Program "names no backend").

The scan reads every import of every module, function-level and TYPE_CHECKING ones included
(an import inside a function is still a dependency, only a later one). Run it by hand over any
tree: `python3 tests/test_worker_imports.py services/worker` prints the module and room cycles.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_imports(top: Path) -> dict[str, set[str]]:
    """module -> the modules under `top` it imports anywhere in its body (a package's own
    ancestors left out: importing a submodule always runs them first)."""
    files = {_name(p): p for p in sorted(top.rglob("*.py"))}
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                names = [f"{base}.{a.name}" for a in node.names]  # a submodule or a name
            else:
                continue
            for name in names:
                while name and name not in files:
                    name = name.rpartition(".")[0]
                if name and name != mod and not mod.startswith(name + "."):
                    edges[mod].add(name)
    return {m: edges.get(m, set()) for m in files}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            node, it = work[-1]
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                    break
                if nxt in on:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def rooms(graph: dict[str, set[str]], depth: int) -> dict[str, set[str]]:
    """The graph between rooms: modules grouped by their first `depth` name parts."""
    def room(m: str) -> str:
        return ".".join(m.split(".")[:depth])
    out: dict[str, set[str]] = defaultdict(set)
    for a, targets in graph.items():
        out[room(a)]
        for b in targets:
            if room(a) != room(b):
                out[room(a)].add(room(b))
    return dict(out)


def _name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


WORKER = ROOT / "services" / "worker"


def _product(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    # The benchmark harness is not product code: its own cycles are its own room's concern.
    return {m: t for m, t in graph.items() if not m.startswith("services.worker.bench")}


def test_scan_finds_a_function_level_cycle(tmp_path, monkeypatch):
    """The scan must see imports inside functions, or it would pass on the cycles it exists to
    catch."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import g\n")
    (pkg / "b.py").write_text("def g():\n    from pkg import a\n    return a\n")
    (pkg / "c.py").write_text("import pkg.a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    graph = module_imports(pkg)
    assert cycles(graph) == [["pkg.a", "pkg.b"]]
    assert graph["pkg.c"] == {"pkg.a"}


def test_no_import_cycle_between_or_inside_the_worker_rooms():
    graph = _product(module_imports(WORKER))
    assert cycles(graph) == []
    assert cycles(rooms(graph, 3)) == []


def test_the_program_names_no_speculative_backend():
    """The Engine builds the proposer (services/worker/spec) and hands it to the Program, which
    calls only the proposer interface: nothing under program/ imports spec/."""
    graph = module_imports(WORKER)
    reached = {(m, t) for m, targets in graph.items() if m.startswith("services.worker.program")
               for t in targets if t.startswith("services.worker.spec")}
    assert reached == set()


if __name__ == "__main__":
    top = ROOT / (sys.argv[1] if len(sys.argv) > 1 else "services/worker")
    found = module_imports(top)
    print("module cycles:", cycles(found))
    print("room cycles:", cycles(rooms(found, len(_name(top / "x.py").split(".")))))
