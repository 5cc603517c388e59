"""Grammars for two node forms the plain emitter does not know: arrays with uniqueItems over a
finite item domain, and integers with multipleOf.

Unique arrays: the state is the set of values used so far (at most `MAX_UNIQUE` values, so at most
2**MAX_UNIQUE states); each state offers every unused value (while maxItems allows) and "]"
(once minItems is reached); states that cannot reach minItems are not entered.

Multiples: canonical integers in [lo, hi] (the range's regular language, `numbers.integer_range`)
intersected with the residue automaton of `multiple` over the digits (a number is divisible
exactly when its absolute value is, so the sign is skipped), written as right-linear rules.
"""

from __future__ import annotations

import json
from typing import Any

from services.grammar.regex import whole_tree
from services.grammar.regex.charset import CharSet
from services.grammar.regex.tree import Chars, to_ebnf
from services.grammar.schema import numbers
from services.grammar.schema.automata import Dfa, TooComplex, intersect, tree_dfa
from services.grammar.schema.nodes import (
    AnyValue,
    ArrayType,
    BooleanType,
    IntegerType,
    Literals,
    Node,
    NoValue,
    NullType,
    Ref,
    Union,
)
from services.grammar.schema.values import json_equal

MAX_UNIQUE = 8  # values of a unique-items domain
MAX_MODULUS = 256  # multipleOf: the product with an int64 range is ~130 kB of grammar at 256


def finite_domain(graph: Any, node: Node, pointer: str, depth: int = 0) -> list[str] | None:
    """The JSON texts of a finite item domain (at most MAX_UNIQUE values), else None."""
    if depth > 32:
        return None
    if isinstance(node, Ref):
        return finite_domain(graph, graph.resolve(node, pointer), pointer, depth + 1)
    out: list[str] = []
    if isinstance(node, Literals):
        out = [json.dumps(json.loads(t), ensure_ascii=False) for t in node.texts]
    elif isinstance(node, NullType):
        out = ["null"]
    elif isinstance(node, BooleanType):
        out = ["true", "false"]
    elif isinstance(node, IntegerType) and node.hi - node.lo < MAX_UNIQUE * node.multiple:
        out = [str(v) for v in range(node.lo, node.hi + 1, node.multiple)]
    elif isinstance(node, Union):
        for b in node.branches:
            part = finite_domain(graph, b, pointer, depth + 1)
            if part is None:
                return None
            out += part
    elif not isinstance(node, NoValue):
        return None
    # values equal as JSON (1 and 1.0) count once
    seen: list[Any] = []
    texts = []
    for t in out:
        v = json.loads(t)
        if not any(json_equal(v, x) for x in seen):
            seen.append(v)
            texts.append(t)
    return texts if len(texts) <= MAX_UNIQUE else None


def unique_array(em: Any, node: ArrayType, graph: Any) -> str:
    """Rule body for an ArrayType with `unique`; `em` is the Emitter."""
    values = finite_domain(graph, node.items, "")
    assert values is not None and not node.prefix
    lits = [em._value_literal(json.loads(t)) for t in values]
    n = len(values)
    lo = node.min_items
    hi = n if node.max_items is None else min(node.max_items, n)
    prefix = em._fresh("u")
    for used in range(2 ** n):
        count = bin(used).count("1")
        alts = []
        if count >= lo:
            alts.append('"]"')
        if count < hi:
            comma = '"," ws ' if count else ""
            for i in range(n):
                if not used & (1 << i) and count + 1 + (n - count - 1) >= lo:
                    alts.append(f"{comma}{lits[i]} ws {prefix}_{used | (1 << i)}")
        em.rules[f"{prefix}_{used}"] = " | ".join(alts) if alts else '"\\u0000" "\\u0000"'
    return f'"[" ws {prefix}_0'


def contains_array(em: Any, node: ArrayType) -> str:
    """Rule body for an ArrayType with `contains` (no prefix): the state is (items so far, capped;
    whether a witness was generated); an item may be generated as the witness once."""
    item, hit = em.rule(node.items), em.rule(node.contains)
    lo, hi = node.min_items, node.max_items
    cap = hi if hi is not None else max(lo, 1)
    prefix = em._fresh("c")

    def name(c: int, found: bool) -> str:
        return f"{prefix}_{c}_{int(found)}"

    for found in (True, False):
        for c in range(cap + 1):
            comma = '"," ws ' if c else ""
            nxt = min(c + 1, cap)
            alts = []
            if found and c >= lo:
                alts.append('"]"')
            if hi is None or c < hi:
                if found or hi is None or c + 2 <= hi:
                    alts.append(f"{comma}{item} ws {name(nxt, found)}")
                if not found:
                    alts.append(f"{comma}{hit} ws {name(nxt, True)}")
            em.rules[name(c, found)] = " | ".join(alts) if alts else '"\\u0000" "\\u0000"'
    return f'"[" ws {name(0, False)}'


def _residues(k: int) -> Dfa:
    digits = [CharSet.of([(0x30 + d, 0x30 + d)]) for d in range(10)]
    start = [(CharSet.chars("-"), 1)] + [(digits[d], 2 + d % k) for d in range(10)]
    after_sign = [(digits[d], 2 + d % k) for d in range(10)]
    rows = [tuple(start), tuple(after_sign)]
    for r in range(k):
        rows.append(tuple((digits[d], 2 + (10 * r + d) % k) for d in range(10)))
    return Dfa(tuple(rows), frozenset({2}))


def multiple_integer(em: Any, node: IntegerType) -> str:
    """Rule body for an IntegerType with multiple > 1 (TooComplex past the product limit)."""
    regex = numbers.integer_ebnf(IntegerType(node.lo, node.hi)).replace('"', "").replace(" ", "")
    dfa = intersect((tree_dfa(whole_tree(regex)), _residues(node.multiple)))
    prefix = em._fresh("m") + "_"
    for q, moves in enumerate(dfa.delta):
        alts = ['""'] if q in dfa.accepting else []
        alts += [f"{to_ebnf(Chars(cs))} {prefix}{t}" for cs, t in moves]
        em.rules[f"{prefix}{q}"] = " | ".join(alts)
    return f"{prefix}0"


def extended(em: Any, node: Node, graph: Any, regions: Any) -> str | None:
    """The emitter hook: a rule body for the node forms of this module and `objects`, else None."""
    from services.grammar.schema.nodes import ObjectType
    from services.grammar.schema.objects import emit_object

    if isinstance(node, ArrayType) and node.unique and \
            finite_domain(graph, node.items, "") is not None:
        return unique_array(em, node, graph)  # else a plain array: the companion keeps it unique
    if isinstance(node, ArrayType) and node.contains is not None:
        return contains_array(em, node)
    if isinstance(node, IntegerType) and node.multiple > 1:
        return multiple_integer(em, node)
    if isinstance(node, ObjectType) and node.extended:
        return emit_object(em, node, regions(node))
    return None


__all__ = ["MAX_MODULUS", "MAX_UNIQUE", "TooComplex", "extended", "finite_domain", "AnyValue"]
