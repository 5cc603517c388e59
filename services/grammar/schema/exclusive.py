"""oneOf exclusivity proofs: type domains, finite value sets, a common required discriminator with
finite values, disjoint numeric ranges and string lengths (design document: "oneOf proves
exclusivity by type domains, finite value sets or the finite values of a common required
discriminator", extended here to disjoint ranges), and objects told apart by a member one requires
whose value the other refuses (a discriminator of any disjoint schemas, or a required name the
other, closed object forbids; `_objects_disjoint`)."""

from __future__ import annotations

import json
from fractions import Fraction

from services.grammar.schema.algebra import Graph, type_domain
from services.grammar.schema.nodes import (
    FULL_TYPES,
    AnyValue,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NumberType,
    ObjectType,
    StringType,
    Union,
    make_union,
)
from shared.errors import UnsupportedSchema


def prove_exclusive(graph: Graph, branches: list[Node], pointer: str) -> None:
    """Raise UnsupportedSchema unless every pair of branches is provably disjoint."""
    for i in range(len(branches)):
        for j in range(i + 1, len(branches)):
            if not _disjoint(graph, branches[i], branches[j], pointer):
                raise graph.ctx.unsupported(
                    pointer, f"oneOf branches {i} and {j} cannot be proved exclusive (by type, "
                             "finite values or a required discriminator); use anyOf")

# How deep the object-member rule may descend (member values of member values ...): recursion in
# the schema graph stays finite, and deeper proofs are not attempted (the oneOf stays refused).
MAX_MEMBER_DEPTH = 6


def _disjoint(graph: Graph, a: Node, b: Node, pointer: str, depth: int = 0) -> bool:
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
        return all(_disjoint(graph, br, other, pointer, depth) for br in u.branches)
    if isinstance(a, (IntegerType, NumberType)) and isinstance(b, (IntegerType, NumberType)):
        return _ranges_disjoint(a, b)
    if isinstance(a, StringType) and isinstance(b, StringType):
        if (a.max_length is not None and a.max_length < b.min_length) or \
                (b.max_length is not None and b.max_length < a.min_length):
            return True
        if (a.patterns or b.patterns) and graph.string_empty is not None:
            # patterns/formats of both on one string: an empty intersection proves disjointness
            hi = a.max_length if b.max_length is None else \
                b.max_length if a.max_length is None else min(a.max_length, b.max_length)
            both = StringType(max(a.min_length, b.min_length), hi, a.patterns + b.patterns)
            return graph.string_empty(both) is True
        return False
    if isinstance(a, ObjectType) and isinstance(b, ObjectType) and depth < MAX_MEMBER_DEPTH:
        return _objects_disjoint(graph, a, b, pointer, depth) or \
            _objects_disjoint(graph, b, a, pointer, depth)
    return False


def _objects_disjoint(graph: Graph, a: ObjectType, b: ObjectType, pointer: str, depth: int) -> bool:
    """A member `name` that `a` requires, whose value in `a` is disjoint from what `b` allows for
    that name (`Graph.value_of`: NEVER where `b` forbids the name, e.g. a closed object without
    it). Every instance of `a` has the member with a value `b` refuses: no value is in both. This
    covers the common required discriminator (disjoint const/enum values) and closed objects told
    apart by a required name."""
    for name in sorted(a.required_names):
        va = graph.value_of(a, name, pointer)
        vb = graph.value_of(b, name, pointer)
        if _disjoint(graph, va, vb, pointer, depth + 1):
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


# The parts of a node that cover every value of their type (see `_parts`).
_FULL = FULL_TYPES


def _parts(graph: Graph, node: Node, pointer: str, depth: int = 0) -> list[tuple[str, Node]] | None:
    """`node` as (JSON type, node of that type only) parts whose union it is; None where that is
    not read here (a reference chain too deep)."""
    if depth > MAX_MEMBER_DEPTH:
        return None
    node = graph.resolve(node, pointer)
    if isinstance(node, AnyValue):
        return list(_FULL.items())
    if isinstance(node, NoValue):
        return []
    if isinstance(node, Union):
        out: list[tuple[str, Node]] = []
        for b in node.branches:
            sub = _parts(graph, b, pointer, depth + 1)
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(node, Literals):
        by_type: dict[str, list[str]] = {}
        for t in node.texts:
            by_type.setdefault(next(iter(type_domain(Literals((t,)), graph))), []).append(t)
        return [(k, Literals(tuple(v))) for k, v in by_type.items()]
    return [(next(iter(type_domain(node, graph))), node)]


def exclusive_by_type(graph: Graph, branches: list[Node], pointer: str) -> Node | None:
    """oneOf read one JSON type at a time, exactly: a value of type T is valid when exactly one
    branch accepts it. Where two branches accept every value of T (their T parts are the whole
    type: e.g. object keywords without `type` leave null, strings, ... unconstrained), or the same
    T part (equal nodes) in every branch that has one, no value of T is valid; where one branch does
    and no other has a T part, all of T is; otherwise the T parts of different branches must be
    provably disjoint (`_disjoint`) and their union is the result. None where a type cannot be
    decided so (the caller refuses or tries complements)."""
    try:
        split = [_parts(graph, b, pointer) for b in branches]
    except UnsupportedSchema:
        return None
    if any(p is None for p in split):
        return None
    out: list[Node] = []
    for t, full in _FULL.items():
        owners = [[n for k, n in parts if k == t] for parts in split]  # type: ignore[union-attr]
        having = [i for i, ns in enumerate(owners) if ns]
        fulls = [i for i in having if full in owners[i]]
        if len(fulls) >= 2:
            continue  # every value of t is in two branches
        if len(having) >= 2 and all(set(owners[i]) == set(owners[having[0]]) for i in having):
            continue  # the same t part in every branch that has one: each such value is in two
        if fulls:
            if len(having) > 1:
                return None  # all of t but what the others accept: no complement read here
            out.append(full)
            continue
        for x in range(len(having)):
            for y in range(x + 1, len(having)):
                for a in owners[having[x]]:
                    for b in owners[having[y]]:
                        try:
                            if not _disjoint(graph, a, b, pointer):
                                return None
                        except UnsupportedSchema:
                            return None
        out += [n for i in having for n in owners[i]]
    return make_union(out)
