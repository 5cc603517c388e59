"""oneOf exclusivity proofs: type domains, finite value sets, a common required discriminator with
finite values, disjoint numeric ranges and string lengths (design document: "oneOf proves
exclusivity by type domains, finite value sets or the finite values of a common required
discriminator"; issue 8 adds disjoint ranges)."""

from __future__ import annotations

import json
from fractions import Fraction

from services.grammar.schema.algebra import Graph, type_domain
from services.grammar.schema.nodes import (
    IntegerType, Literals, Node, NoValue, NumberType, ObjectType, StringType, Union,
)


def prove_exclusive(graph: Graph, branches: list[Node], pointer: str) -> None:
    """Raise UnsupportedSchema unless every pair of branches is provably disjoint."""
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if not _disjoint(graph, branches[i], branches[j], pointer):
                raise graph.ctx.unsupported(
                    pointer, f"oneOf branches {i} and {j} cannot be proved exclusive (by type, "
                             "finite values or a required discriminator); use anyOf")

def _disjoint(graph: Graph, a: Node, b: Node, pointer: str) -> bool:
    a, b = graph.resolve(a, pointer), graph.resolve(b, pointer)
    if isinstance(a, NoValue) or isinstance(b, NoValue):
        return True
    if not type_domain(a, graph) & type_domain(b, graph):
        return True
    if isinstance(a, Literals) or isinstance(b, Literals):
        lits, other = (a, b) if isinstance(a, Literals) else (b, a)
        return not any(graph.matches(other, json.loads(t), pointer) for t in lits.texts)
    if isinstance(a, Union) or isinstance(b, Union):
        u, other = (a, b) if isinstance(a, Union) else (b, a)
        return all(_disjoint(graph, br, other, pointer) for br in u.branches)
    if isinstance(a, (IntegerType, NumberType)) and isinstance(b, (IntegerType, NumberType)):
        return _ranges_disjoint(a, b)
    if isinstance(a, StringType) and isinstance(b, StringType) and not (a.patterns or b.patterns):
        return (a.max_length is not None and a.max_length < b.min_length) or \
            (b.max_length is not None and b.max_length < a.min_length)
    if isinstance(a, ObjectType) and isinstance(b, ObjectType):
        for name in a.required_names & b.required_names:
            va = graph.resolve(graph.value_of(a, name, pointer), pointer)
            vb = graph.resolve(graph.value_of(b, name, pointer), pointer)
            if isinstance(va, Literals) and isinstance(vb, Literals) and _disjoint(graph, va, vb, pointer):
                return True
    return False


def _interval(n: IntegerType | NumberType) -> tuple:
    if isinstance(n, IntegerType):
        return Fraction(n.lo), False, Fraction(n.hi), False
    return n.lo, n.lo_exclusive, n.hi, n.hi_exclusive


def _ranges_disjoint(a: IntegerType | NumberType, b: IntegerType | NumberType) -> bool:
    """True when the two numeric ranges cannot share a value (oneOf by disjoint ranges)."""
    alo, alx, ahi, ahx = _interval(a)
    blo, blx, bhi, bhx = _interval(b)

    def below(hi: Fraction | None, hx: bool, lo: Fraction | None, lx: bool) -> bool:
        return hi is not None and lo is not None and (hi < lo or (hi == lo and (hx or lx)))

    return below(ahi, ahx, blo, blx) or below(bhi, bhx, alo, alx)
