"""Objects with patternProperties, propertyNames or minProperties/maxProperties.

Names that are not declared fall into regions, each a regular language of names with one value
schema: for every pattern, the names it matches (minus the declared names, inside propertyNames);
and the names no pattern matches, with additionalProperties. Patterns with different schemas must
not overlap on undeclared names (an overlap would need the intersection of their schemas per
subset: refused, UnsupportedSchema at the later pattern; patterns with equal schemas may, the
intersection being that schema); at most `MAX_PATTERNS` patterns. Declared values already
hold the patterns their names match (`Graph.object_type`).

The grammar counts members where a count is bounded: a state is (next declared property, members
so far), members so far capped at maxProperties (or at minProperties when there is no maximum),
and only states from which the object can still be completed are entered, so no prefix is a dead
end. Member order is the generation layout of every object: declared properties in declared
order, then the other members.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.grammar.schema.automata import Dfa, TooComplex, json_string_rules, tree_dfa
from services.grammar.schema.context import Context
from services.grammar.schema.dfa_logic import combine, literal_dfa
from services.grammar.schema.nodes import AnyValue, Literals, Node, NoValue, ObjectType, StringType
from services.grammar.schema.strings import key_excluding, literal

if TYPE_CHECKING:
    from services.grammar.schema.patterns import PatternSupport

MAX_PATTERNS = 8


def _names_dfa(names: Node, ps: "PatternSupport", ctx: Context, pointer: str) -> Dfa | None:
    """propertyNames as a DFA over names (None: every name)."""
    if isinstance(names, AnyValue):
        return None
    if isinstance(names, NoValue):
        return literal_dfa(())
    if isinstance(names, Literals):
        import json

        values = [json.loads(t) for t in names.texts]
        return literal_dfa(tuple(v for v in values if isinstance(v, str)))
    if isinstance(names, StringType):
        if not names.patterns and names.min_length == 0 and names.max_length is None:
            return None
        return ps.string_dfa(names, ctx)
    raise ctx.unsupported(pointer, "propertyNames must reduce to one string schema or a finite "
                                   "set of names")


def regions(obj: ObjectType, ps: "PatternSupport", ctx: Context) -> list[tuple[Dfa | None, Node]]:
    """(name language, value schema) for the undeclared names of `obj`; a None language means
    "every name that is not declared" (the key trie of plain objects)."""
    where = obj.patterns[-1][0].pointer if obj.patterns else ""
    if len(obj.patterns) > MAX_PATTERNS:
        raise ctx.unsupported(where, f"more than {MAX_PATTERNS} patternProperties")
    try:
        names = _names_dfa(obj.names, ps, ctx, where)
        if not obj.patterns and names is None:
            return [] if isinstance(obj.additional, NoValue) else [(None, obj.additional)]
        declared = literal_dfa(tuple(k for k, _ in obj.properties))
        base = (declared,) + ((names,) if names is not None else ())
        nb = len(base)

        def inside(v: tuple[bool, ...]) -> bool:  # not declared, allowed by propertyNames
            return not v[0] and (nb == 1 or v[1])

        # Per pattern, the names both readings match (where its schema applies for sure) and the
        # names either reading matches (where it may apply: no other region may take them).
        both, either = [], []
        for p, _ in obj.patterns:
            both.append(tree_dfa(ps.readings(p).meet))
            either.append(tree_dfa(ps.readings(p).join))
        for i in range(len(either)):
            for j in range(i + 1, len(either)):
                if obj.patterns[i][1] == obj.patterns[j][1]:
                    continue  # the same schema: a name in both regions takes it once either way
                overlap = combine(base + (either[i], either[j]),
                                  lambda v: inside(v) and v[nb] and v[nb + 1])
                if overlap.delta:
                    raise ctx.unsupported(
                        obj.patterns[j][0].pointer,
                        "patternProperties overlap on "
                        "names that are not declared (their schemas would have "
                        "to be intersected per name): not supported",
                    )
        out: list[tuple[Dfa | None, Node]] = []
        for i, (_, value) in enumerate(obj.patterns):
            lang = combine(base + (both[i],), lambda v: inside(v) and v[nb])
            if lang.delta and not isinstance(value, NoValue):
                out.append((lang, value))
        if not isinstance(obj.additional, NoValue):
            rest = combine(base + tuple(either), lambda v: inside(v) and not any(v[nb:]))
            if rest.delta:
                out.append((rest, obj.additional))
        return out
    except TooComplex as exc:
        raise ctx.unsupported(
            where, f"the property-name languages are too complex: {exc}"
        ) from None


def emit_object(em: Any, node: ObjectType, found: list[tuple[Dfa | None, Node]]) -> str:
    """The rule body for an extended object; `em` is the Emitter (rules, rule(), _fresh())."""
    required = node.required_names
    # an optional member whose value generates nothing is left out (schema/nothing.py)
    props = [(k, v) for k, v in node.properties if not isinstance(v, NoValue) and (
        k in required or not em.generates_nothing(v))]
    extras = []
    for lang, value in found:
        if lang is None:
            key = em._fresh("k")
            em.rules.update(key_excluding([k for k, _ in node.properties], key))
        else:
            key, rules = json_string_rules(lang, em._fresh("k") + "_")
            em.rules.update(rules)
        extras.append(f'{key} ws ":" ws {em.rule(value)}')
    extra = ("(" + " | ".join(extras) + ")") if extras else None
    lo, hi = node.min_props, node.max_props
    cap = hi if hi is not None else max(lo, 1)
    n = len(props)
    need = [sum(1 for k, _ in props[i:] if k in required) for i in range(n + 1)]
    room = [n - i for i in range(n + 1)]  # declared members still possible from i

    def feasible(i: int, c: int) -> bool:
        if hi is not None and c + need[i] > hi:
            return False
        return extra is not None or c + room[i] >= lo

    prefix = em._fresh("o")

    def name(i: int, c: int) -> str:
        return f"{prefix}_{i}_{c}"

    def comma(c: int) -> str:
        return '"," ws ' if c > 0 else ""

    for c in range(cap + 1):
        alts = []
        if extra is not None and (hi is None or c < hi):
            alts.append(f"{comma(c)}{extra} ws {name(n, min(c + 1, cap))}")
        if c >= lo:
            alts.append('"}"')
        em.rules[name(n, c)] = " | ".join(alts) if alts else '"\\u0000" "\\u0000"'
    for i in range(n - 1, -1, -1):
        key, sub = props[i]
        for c in range(cap + 1):
            alts = []
            nxt = min(c + 1, cap)
            if (hi is None or c < hi) and feasible(i + 1, nxt):
                alts.append(
                    f'{comma(c)}{literal(key)} ws ":" ws {em.rule(sub)} ws {name(i + 1, nxt)}'
                )
            if key not in required and feasible(i + 1, c):
                alts.append(name(i + 1, c))
            em.rules[name(i, c)] = " | ".join(alts) if alts else '"\\u0000" "\\u0000"'
    return f'"{{" ws {name(0, 0)}'
