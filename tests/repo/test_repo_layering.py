"""The layering rules DESIGN.md ("Grammar service layout") says a test checks, on the import graph
of tests/support/import_graph.py (every import statement, module-level and function-level; those
under `if TYPE_CHECKING:` never run and are left out of the rules):

- "the worker reaches the grammar service only through `services/grammar/client.py`";
- "the gateway knows only the `WorkerClient` interface": it imports nothing of the worker, the
  grammar service or the wiring that picks a concrete client;
- "`kernels/` and `shared/` import nothing from `services/`" (nor from bench/);
- bench/ imports downwards only: no module of the product imports it, except services/cli.py
  adding the `infernix bench ...` commands from bench/cli.py;
- "no import cycles": none between modules, and none between rooms (a folder, or a module beside
  sub-folders)."""

from __future__ import annotations

from tests.support import import_graph as ig


def _runtime_edges():
    return [e for e in ig.edges() if not e.type_checking]


def _where(edges) -> str:
    return "\n".join(f"{e.source}:{e.line} imports {e.target}"
                     f"{' (in a function)' if e.function_level else ''}" for e in edges)


def test_the_scan_reads_function_level_and_relative_imports(tmp_path, monkeypatch):
    """The graph holds what the rules need: a function-level import, a relative import, a
    `from package import module` and a TYPE_CHECKING import (marked)."""
    pkg = tmp_path / "services" / "x"
    pkg.mkdir(parents=True)
    (tmp_path / "services" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                              "    from services.x import c\n"
                              "def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from services.x import a\n")
    (pkg / "c.py").write_text("")
    monkeypatch.setattr(ig, "ROOT", tmp_path)
    for cached in (ig.modules, ig.edges, ig._packages_with_folders):
        cached.cache_clear()
    try:
        found = {(e.source, e.target, e.function_level, e.type_checking) for e in ig.edges()}
        assert found == {("services.x.a", "services.x.c", False, True),
                         ("services.x.a", "services.x.b", True, False),
                         ("services.x.b", "services.x.a", False, False)}
        assert ig.cycles(ig.graph()) == [["services.x.a", "services.x.b"]]
    finally:
        for cached in (ig.modules, ig.edges, ig._packages_with_folders):
            cached.cache_clear()


def test_the_worker_reaches_the_grammar_service_only_through_its_client():
    bad = [e for e in _runtime_edges() if e.source.startswith("services.worker.")
           and e.target.startswith("services.grammar") and e.target != "services.grammar.client"]
    assert not bad, _where(bad)


def test_the_gateway_knows_only_the_worker_client_interface():
    """The gateway's WorkerClient is shared.generation's interface; which implementation serves
    it (in process, gRPC, a pool) is services/cli.py's and services/embedded.py's choice."""
    forbidden = ("services.worker", "services.grammar", "services.embedded", "services.cli",
                 "bench")
    bad = [e for e in _runtime_edges() if e.source.startswith("services.gateway")
           and e.target.startswith(forbidden)]
    assert not bad, _where(bad)


def test_kernels_and_shared_import_nothing_above_them():
    bad = [e for e in ig.edges() if e.source.startswith(("kernels", "shared"))
           and e.target.startswith(("services", "bench"))]
    assert not bad, _where(bad)


def test_the_product_does_not_import_bench():
    allowed = {("services.cli", "bench.cli")}  # the `infernix bench ...` commands, added lazily
    bad = [e for e in ig.edges() if not e.source.startswith("bench")
           and e.target.startswith("bench") and (e.source, e.target) not in allowed]
    assert not bad, _where(bad)


def test_no_import_cycle_between_modules():
    assert ig.cycles(ig.graph()) == []


def test_no_import_cycle_between_rooms():
    found = ig.cycles(ig.room_graph())
    edges = ig.room_edges()
    detail = "\n".join(_where(es) for (a, b), es in sorted(edges.items())
                       for c in found if a in c and b in c)
    assert not found, f"room cycles {found}:\n{detail}"
