"""Intersection, value membership and oneOf exclusivity on the reduced schema graph.

`Graph.meet` is the allOf intersection: per type, per property, per array position; a reference
meets by a memoized derived definition so recursion stays a graph. `Graph.matches` decides whether a
finite value belongs to a node (const/enum filtering, proofs). The oneOf proofs are in `exclusive`,
what plain JSON values need (equality, types) in `values`.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction
from typing import Any

from services.grammar.schema.context import MAX_DEPTH, Context
from services.grammar.schema.nodes import (
    ANY,
    NEVER,
    AnyValue,
    ArrayType,
    BooleanType,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NullType,
    NumberType,
    ObjectType,
    Ref,
    Required,
    StringType,
    Union,
    make_union,
)
from services.grammar.schema.numbers import (  # noqa: F401 (re-exported: the range helpers)
    integer_bounds,
    integer_type,
    number_empty,
    number_range,
)
from services.grammar.schema.values import in_bounds, json_equal

_IN_PROGRESS = NoValue()  # placeholder while a definition is being built


def _lower(
    a: tuple[Fraction | None, bool], b: tuple[Fraction | None, bool]
) -> tuple[Fraction | None, bool]:
    if a[0] is None:
        return b
    if b[0] is None or a[0] > b[0]:
        return a
    if b[0] > a[0]:
        return b
    return a[0], a[1] or b[1]


def _upper(
    a: tuple[Fraction | None, bool], b: tuple[Fraction | None, bool]
) -> tuple[Fraction | None, bool]:
    if a[0] is None:
        return b
    if b[0] is None or a[0] < b[0]:
        return a
    if b[0] < a[0]:
        return b
    return a[0], a[1] or b[1]


class Graph:
    """The definitions of one reduction and the operations on them."""

    def __init__(self, ctx: Context, pattern_matcher: Any, string_empty: Any = None,
                 pattern_check: Any = None) -> None:
        self.ctx = ctx
        # pattern_check(pattern: Pattern, negated: bool = False): raises where the pattern does
        # not parse, or (negated) where its complement would not be exact
        self.pattern_check = pattern_check or (lambda p, negated=False: pattern_matcher(p, ""))
        self.defs: dict[str, Node] = {}
        self._meet_memo: dict[tuple[str, Node], str] = {}
        # pattern_matcher(pattern: Pattern, value: str) -> bool, or raises UnsupportedSchema
        self.pattern_matcher = pattern_matcher
        # string_empty(node: StringType) -> bool | None: whether no string satisfies the node's
        # patterns and lengths together (None: not decided within the automaton limits)
        self.string_empty = string_empty
        self.first_empty: str | None = None  # the pointer of the first string found empty
        # meets of a reference whose definition is still being read: (name, ref, other, pointer)
        self._deferred: list[tuple[str, Ref, Node, str]] = []

    # -- references -------------------------------------------------------------------------
    def resolve(self, node: Node, pointer: str) -> Node:
        seen = 0
        while isinstance(node, Ref):
            target = self.defs[node.name]
            if target is _IN_PROGRESS:
                raise self.ctx.unsupported(pointer, f"reference {node.name!r} is intersected with "
                                                    "itself while it is being defined")
            node = target
            seen += 1
            if seen > MAX_DEPTH:
                raise self.ctx.unsupported(pointer, "reference chain is too deep")
        return node

    def begin(self, name: str) -> None:
        self.defs[name] = _IN_PROGRESS

    def _in_progress(self, node: Ref) -> bool:
        seen = 0
        while isinstance(node, Ref) and seen <= MAX_DEPTH:
            target = self.defs.get(node.name)
            if target is _IN_PROGRESS:
                return True
            node, seen = target, seen + 1
        return False

    def settle(self) -> None:
        """Compute the deferred meets whose reference is now defined (each may defer more)."""
        progress = True
        while progress:
            progress = False
            for item in list(self._deferred):
                name, ref, other, pointer = item
                if self._in_progress(ref):
                    continue
                self._deferred.remove(item)
                self.defs[name] = self.meet(self.resolve(ref, pointer), other, pointer)
                progress = True

    def finish(self) -> None:
        """After the whole document is read: every deferred meet is computed."""
        self.settle()
        if self._deferred:
            name, ref, _, pointer = self._deferred[0]
            raise self.ctx.unsupported(pointer, f"reference {ref.name!r} is intersected with "
                                                "itself while it is being defined")

    # -- intersection -----------------------------------------------------------------------
    def meet(self, a: Node, b: Node, pointer: str) -> Node:
        """The allOf intersection of two nodes."""
        if isinstance(a, AnyValue):
            return b
        if isinstance(b, AnyValue):
            return a
        if isinstance(a, NoValue) or isinstance(b, NoValue):
            return NEVER
        if a == b:
            return a
        self.ctx.count_merge(pointer)
        if isinstance(a, Literals) or isinstance(b, Literals):
            lits, other = (a, b) if isinstance(a, Literals) else (b, a)
            return self.filter_literals(lits, other, pointer)
        if isinstance(a, Ref) or isinstance(b, Ref):
            ref, other = (a, b) if isinstance(a, Ref) else (b, a)
            return self._meet_ref(ref, other, pointer)
        if isinstance(a, Union):  # distribute, keeping the operand order (property order)
            return make_union([self.meet(br, b, pointer) for br in a.branches])
        if isinstance(b, Union):
            return make_union([self.meet(a, br, pointer) for br in b.branches])
        return self._meet_typed(a, b, pointer)

    def accepts_nothing(self, name: str) -> bool:
        """A finished definition that is no value (a reference to it is NEVER, not a rule)."""
        target = self.defs.get(name)
        return isinstance(target, NoValue) and target is not _IN_PROGRESS

    def _meet_ref(self, ref: Ref, other: Node, pointer: str) -> Node:
        key = (ref.name, other)
        if key in self._meet_memo:
            name = self._meet_memo[key]
            return NEVER if self.accepts_nothing(name) else Ref(name)
        name = f"{ref.name}&{len(self._meet_memo)}"
        self._meet_memo[key] = name
        self.begin(name)
        if self._in_progress(ref):
            # The definition refers to itself through an intersection (an allOf/anyOf member of
            # its own subtree): the meet is the same function of the finished definition, so it
            # is computed once that is read (settle). Whatever needs it resolved before then
            # (a oneOf proof, a complement) still refuses.
            self._deferred.append((name, ref, other, pointer))
            return Ref(name)
        target = self.resolve(ref, pointer)
        self.defs[name] = self.meet(target, other, pointer)
        return NEVER if self.accepts_nothing(name) else Ref(name)

    def _meet_typed(self, a: Node, b: Node, pointer: str) -> Node:
        if isinstance(a, NumberType) and isinstance(b, IntegerType):
            a, b = b, a
        if isinstance(a, IntegerType) and isinstance(b, NumberType):
            return integer_bounds(b, a.lo, a.hi, a.multiple)
        if type(a) is not type(b):
            return NEVER
        if isinstance(a, (NullType, BooleanType)):
            return a
        if isinstance(a, IntegerType):
            return integer_type(max(a.lo, b.lo), min(a.hi, b.hi), math.lcm(a.multiple, b.multiple))
        if isinstance(a, NumberType):
            lo = _lower((a.lo, a.lo_exclusive), (b.lo, b.lo_exclusive))
            hi = _upper((a.hi, a.hi_exclusive), (b.hi, b.hi_exclusive))
            return number_range(NumberType(lo[0], lo[1], hi[0], hi[1]), self.ctx, pointer)
        if isinstance(a, StringType):
            return self.satisfiable(string_type(max(a.min_length, b.min_length),
                                                _min_opt(a.max_length, b.max_length),
                                                tuple(dict.fromkeys(a.patterns + b.patterns))))
        if isinstance(a, ArrayType):
            return self._meet_array(a, b, pointer)
        return self._meet_object(a, b, pointer)

    def satisfiable(self, node: Node) -> Node:
        """`node`, or NEVER where it is a string node whose patterns/formats and lengths together
        provably match no string in any reading (`PatternSupport.empty`: e.g. a oneOf branch's
        format under the parent's pattern, or the complement of a pattern every string matches:
        the rest of the schema may still be satisfiable); undecided nodes (past the automaton
        limits) are kept and refused where emitted."""
        if isinstance(node, StringType) and self.string_empty is not None and node.patterns and \
                self.string_empty(node) is True:
            if self.first_empty is None:
                self.first_empty = node.patterns[-1].pointer
            return NEVER
        return node

    def _meet_array(self, a: ArrayType, b: ArrayType, pointer: str) -> Node:
        n = max(len(a.prefix), len(b.prefix))
        pos = lambda arr, i: arr.prefix[i] if i < len(arr.prefix) else arr.items  # noqa: E731
        prefix = [self.meet(pos(a, i), pos(b, i), pointer) for i in range(n)]
        if a.contains is not None and b.contains is not None and a.contains != b.contains:
            raise self.ctx.unsupported(pointer, "allOf of two different contains is not supported")
        contains = a.contains if a.contains is not None else b.contains
        return array_type(prefix, self.meet(a.items, b.items, pointer),
                          max(a.min_items, b.min_items), _min_opt(a.max_items, b.max_items),
                          a.unique or b.unique, contains, self, pointer)

    def _meet_object(self, a: ObjectType, b: ObjectType, pointer: str) -> Node:
        names = list(dict.fromkeys([k for k, _ in a.properties] + [k for k, _ in b.properties]))
        props = tuple((k, self.meet(self.value_of(a, k, pointer), self.value_of(b, k, pointer),
                                    pointer)) for k in names)
        required = tuple({r.name: r for r in b.required + a.required}.values())
        additional = self.meet(a.additional, b.additional, pointer)
        if a.patterns and b.patterns:
            if not (isinstance(a.additional, AnyValue) and isinstance(b.additional, AnyValue)):
                raise self.ctx.unsupported(pointer, "allOf of objects that both have "
                                                    "patternProperties and additionalProperties")
            patterns = a.patterns + b.patterns
        else:  # fold the other side's rule for undeclared names into each pattern's schema
            own, other = (a, b) if a.patterns else (b, a)
            patterns = tuple((p, self.meet(v, other.additional, pointer)) for p, v in own.patterns)
        return self.object_type(props, required, additional, patterns,
                                self.meet(a.names, b.names, pointer), max(a.min_props, b.min_props),
                                _min_opt(a.max_props, b.max_props), pointer, declared_final=True)

    def value_of(self, obj: ObjectType, name: str, pointer: str) -> Node:
        """The schema a member named `name` must satisfy in `obj` (NEVER: it may not occur)."""
        if not isinstance(obj.names, AnyValue) and not self.matches(obj.names, name, pointer):
            return NEVER
        for key, node in obj.properties:
            if key == name:
                return node
        matched = [v for p, v in obj.patterns if self.pattern_matcher(p, name)]
        if not matched:
            return obj.additional
        node = matched[0]
        for v in matched[1:]:
            node = self.meet(node, v, pointer)
        return node

    def object_type(self, props: tuple, required: tuple[Required, ...], additional: Node,
                    patterns: tuple = (), names: Node = ANY, min_props: int = 0,
                    max_props: int | None = None, pointer: str = "",
                    declared_final: bool = False) -> Node:
        """An object node with declared values met with the patterns their names match, required
        names that are not declared added as declared members, names outside propertyNames
        impossible; NEVER when a required member is impossible or the counts cannot be met.
        `declared_final`: the declared values already hold all of that (an intersection)."""
        probe = ObjectType((), (), additional, patterns, names)
        out = list(props) if declared_final else []
        for k, v in ([] if declared_final else props):
            if not isinstance(names, AnyValue) and not self.matches(names, k, pointer):
                v = NEVER
            for p, pv in patterns:
                if not isinstance(v, NoValue) and self.pattern_matcher(p, k):
                    v = self.meet(v, pv, pointer)
            out.append((k, v))
        declared = {k for k, _ in out}
        out += [(r.name, self.value_of(probe, r.name, pointer)) for r in required
                if r.name not in declared]
        free_count_check(self.ctx, pointer, min_props, len(required), additional, patterns, names)
        obj = ObjectType(
            tuple(out), required, additional, tuple(patterns), names, min_props, max_props
        )
        if any(isinstance(obj.value_of(r.name), NoValue) for r in required):
            return NEVER
        if max_props is not None and (max_props < min_props or max_props < len(required)):
            return NEVER
        possible = sum(1 for _, v in out if not isinstance(v, NoValue))
        free = not isinstance(names, NoValue) and (not isinstance(additional, NoValue) or patterns)
        if min_props > possible and not free:  # propertyNames false: no undeclared name either
            return NEVER
        return obj

    # -- finite values ----------------------------------------------------------------------
    def filter_literals(self, lits: Literals, other: Node, pointer: str) -> Node:
        kept = tuple(t for t in lits.texts if self.matches(other, json.loads(t), pointer))
        return Literals(kept) if kept else NEVER

    def matches(self, node: Node, value: Any, pointer: str, depth: int = 0) -> bool:
        """Whether the JSON value `value` belongs to `node`."""
        if depth > MAX_DEPTH:
            raise self.ctx.unsupported(pointer, f"finite value recursion deeper than {MAX_DEPTH}")
        d = depth + 1
        if isinstance(node, AnyValue):
            return True
        if isinstance(node, NoValue):
            return False
        if isinstance(node, Ref):
            return self.matches(self.resolve(node, pointer), value, pointer, d)
        if isinstance(node, Union):
            return any(self.matches(b, value, pointer, d) for b in node.branches)
        if isinstance(node, Literals):
            return any(json_equal(json.loads(t), value) for t in node.texts)
        if isinstance(node, NullType):
            return value is None
        if isinstance(node, BooleanType):
            return isinstance(value, bool)
        if isinstance(value, bool):
            return False
        if isinstance(node, IntegerType):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            return (
                isinstance(value, int)
                and node.lo <= value <= node.hi
                and value % node.multiple == 0
            )
        if isinstance(node, NumberType):
            return isinstance(value, (int, float)) and in_bounds(node, Fraction(value))
        if isinstance(node, StringType):
            if not isinstance(value, str) or len(value) < node.min_length:
                return False
            if node.max_length is not None and len(value) > node.max_length:
                return False
            return all(self.pattern_matcher(p, value) for p in node.patterns)
        if isinstance(node, ArrayType):
            if not isinstance(value, list) or len(value) < node.min_items:
                return False
            if node.max_items is not None and len(value) > node.max_items:
                return False
            if node.unique and any(
                json_equal(x, y) for i, x in enumerate(value) for y in value[i + 1 :]
            ):
                return False
            if node.contains is not None and not any(self.matches(node.contains, x, pointer, d)
                                                     for x in value):
                return False
            return all(self.matches(node.prefix[i] if i < len(node.prefix) else node.items, v,
                                    pointer, d) for i, v in enumerate(value))
        assert isinstance(node, ObjectType)
        if not isinstance(value, dict) or not node.required_names <= value.keys():
            return False
        if len(value) < node.min_props or (
            node.max_props is not None and len(value) > node.max_props
        ):
            return False
        return all(
            self.matches(self.value_of(node, k, pointer), v, pointer, d) for k, v in value.items()
        )


def free_count_check(ctx: Context, pointer: str, min_props: int, required: int, additional: Node,
                     patterns: tuple, names: Node = ANY) -> None:
    """Refuse a minimum member count that undeclared names could reach only by repeating a
    name: the grammar cannot exclude a name used earlier, counts a repeat as a member, and a
    parser keeps one (`{"minProperties": 2}` accepted `{"a":1,"a":2}`). Members beyond the
    required ones count safely while one free member suffices, or where the consumer keeps names
    unique (`ctx.unique_names`) and undeclared names are any string (no patterns, no
    propertyNames): infinitely many distinct names then fill every count, so no name set runs out
    below the minimum."""
    if ctx.unique_names and not patterns and isinstance(names, AnyValue):
        return
    if min_props >= required + 2 and (patterns or not isinstance(additional, NoValue)):
        raise ctx.unsupported(pointer, f"at least {min_props} members where undeclared names may "
                                       "fill the count: a generated object could repeat a name, "
                                       "which JSON parsers keep once (not supported yet; declare "
                                       "the members or close the object)")


def _min_opt(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def string_type(min_length: int, max_length: int | None, patterns: tuple = ()) -> Node:
    if max_length is not None and min_length > max_length:
        return NEVER
    return StringType(min_length, max_length, patterns)


def too_few_distinct(graph: "Graph", items: Node, min_items: int) -> bool:
    """Whether a unique array's finite item domain has fewer values than `min_items` (no such
    array exists; its grammar would have a state with no way on)."""
    from services.grammar.schema.arrays import finite_domain

    values = finite_domain(graph, items, "")
    return values is not None and len(values) < min_items


def array_type(prefix: list[Node], items: Node, min_items: int, max_items: int | None,
               unique: bool = False, contains: Node | None = None, graph: "Graph | None" = None,
               pointer: str = "") -> Node:
    """An array node with impossible positions cut: the array may end before a NEVER position;
    only when min_items crosses it is the whole array impossible."""
    limit = max_items
    for i, p in enumerate(prefix):
        if isinstance(p, NoValue):
            limit = i if limit is None else min(limit, i)
            break
    if isinstance(items, NoValue):
        limit = len(prefix) if limit is None else min(limit, len(prefix))
    if limit is not None and min_items > limit:
        return NEVER
    if limit is not None:
        prefix = prefix[:limit]
    while prefix and prefix[-1] == items:  # trailing positions equal to the tail rule
        prefix = prefix[:-1]
    if limit is not None and limit <= 1:
        unique = False  # at most one item: always unique
    if unique and graph is not None and too_few_distinct(graph, items, min_items):
        return NEVER
    if contains is not None:
        assert graph is not None
        if prefix:  # before the witness is met with `items`: a prefix item may be the witness
            raise graph.ctx.unsupported(pointer, "contains together with positional items is not "
                                                 "supported")
        hit = graph.meet(contains, items, pointer)  # the witness must be an item too
        if isinstance(hit, NoValue) or limit == 0:
            return NEVER
        min_items = max(min_items, 1)
        contains = hit
    return ArrayType(tuple(prefix), items, min_items, limit, unique, contains)



