"""`oneOf`: exactly one branch holds, read as a union of provably disjoint branches or of
"this branch and no other" (each branch met with the exact complements of the others).

A proof of disjointness (`exclusive.prove_exclusive`, by type, finite values, a required
discriminator, string automata; `exclusive.exclusive_by_type`, one JSON type at a time) keeps the
branches as they are. Otherwise, with at most MAX_ONE_OF_COMPLEMENTS branches, branch i becomes
X_i and not X_j for every j != i, where every X_j has an exact complement
(`applicators.complement`) among the values of X_i; else the first proof's UnsupportedSchema
stands.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from services.grammar.schema import applicators
from services.grammar.schema.context import child
from services.grammar.schema.exclusive import exclusive_by_type, prove_exclusive
from services.grammar.schema.nodes import Node, Union, make_union
from shared.errors import UnsupportedSchema

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader

MAX_ONE_OF_COMPLEMENTS = 6  # branches of a oneOf reduced as "this branch and no other"
MAX_ONE_OF_UNION = 32  # union branches that reduction may produce


def one_of(r: "Reader", node: Node, subs: list, at: str, depth: int) -> Node:
    """Exactly one of the schemas `subs` (each met with `node`): a union when the met branches
    are provably disjoint; else node and (X_i and not X_j for every j != i), for each i, where
    every X_j has an exact complement (`applicators.complement`) among the values of the met
    branch i (all values, or objects with the names of a closed branch i).

    Where a branch holds a keyword that narrows in one reading only (Reader.flipped), X_j is
    complemented as the other bound, and the proof is made on the upper bounds: disjoint there,
    each lower-bound branch lies outside the others in every reading."""
    # A proof of exclusivity is a complement too (each branch excludes the others)
    r.complemented.update(child(at, i) for i in range(len(subs)))
    before = r.marks()
    raw = [r.read(s, child(at, i), depth) for i, s in enumerate(subs)]
    other = raw if r.marks() == before else \
        [r.flipped(s, child(at, i), depth) for i, s in enumerate(subs)]
    branches = [r.graph.meet(node, x, at) for x in raw]
    proved = branches if other is raw or r.upper else [r.graph.meet(node, x, at) for x in other]
    try:
        prove_exclusive(r.graph, proved, at)
        return make_union(branches)
    except UnsupportedSchema as unproved:
        # one type at a time concludes "in two branches" as well: only where the readings agree
        sliced = exclusive_by_type(r.graph, branches, at) if other is raw else None
        if sliced is not None:
            return sliced
        if len(branches) > MAX_ONE_OF_COMPLEMENTS:
            raise unproved
        out = []
        for i, b in enumerate(branches):
            # a closed branch has finitely many names: the others' closed objects have an
            # exact complement among its values (applicators.complement's `within`)
            within = applicators.closed_names(r.graph, b, at)
            for j, x in enumerate(other):
                if j != i:
                    c = applicators.complement(r, x, at, within=within)
                    if c is None:
                        raise unproved
                    b = r.graph.meet(b, c, at)
            out.append(b)
        result = make_union(out)
        size = len(result.branches) if isinstance(result, Union) else 1
        if size > MAX_ONE_OF_UNION:
            raise r.ctx.unsupported(at, f"oneOf: the exclusive form needs {size} union "
                                           f"branches (limit {MAX_ONE_OF_UNION})")
        return result
