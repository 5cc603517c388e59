"""The worker's rooms import each other one way only (DESIGN.md, "Worker layout": "no import
cycles"; the speculation room: the Program "names no backend").

On tests/support/import_graph.py's scan (every import of every module, function-level ones
included); here TYPE_CHECKING imports count too, so the worker's rooms stay one-way even for the
type checker. `python3 -m tests.worker.test_worker_imports` prints the worker's module and room
cycles.
"""

from __future__ import annotations

from tests.support import import_graph as ig


def _worker(*, runtime_only: bool) -> dict[str, set[str]]:
    graph = ig.graph(runtime_only=runtime_only)
    return {m: {t for t in ts if t.startswith("services.worker")}
            for m, ts in graph.items() if m.startswith("services.worker")}


def _rooms(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {ig.room(m): set() for m in graph}
    for m, targets in graph.items():
        for t in targets:
            if ig.room(t) != ig.room(m):
                out[ig.room(m)].add(ig.room(t))
    return out


def test_no_import_cycle_between_or_inside_the_worker_rooms():
    graph = _worker(runtime_only=False)
    assert ig.cycles(graph) == []
    assert ig.cycles(_rooms(graph)) == []


def test_the_program_names_no_speculative_backend():
    """The Engine builds the proposer (services/worker/spec) and hands it to the Program, which
    calls only the proposer interface: nothing under program/ imports spec/."""
    reached = {(e.source, e.target) for e in ig.edges()
               if e.source.startswith("services.worker.program")
               and e.target.startswith("services.worker.spec")}
    assert reached == set()


def test_prepare_names_no_tool_format():
    """What differs between tool formats (codings, the name constraint, the stream's type) is the
    ToolFormat's (shared/frontends/formats/): request preparation imports no format module."""
    graph = ig.graph(runtime_only=False)
    formats = {m for m in graph["services.worker.engine.prepare"]
               if m.startswith("shared.frontends.formats.")}
    assert formats == set()


if __name__ == "__main__":
    found = _worker(runtime_only=False)
    print("module cycles:", ig.cycles(found))
    print("room cycles:", ig.cycles(_rooms(found)))
