"""Nodes whose generated language is empty although no emptiness proof covers the validators.

A string node can generate nothing while `PatternSupport.empty` cannot show that the validators
accept nothing either: the generated strings are those every reading of a pattern accepts (and
none of a negated one's readings), so `\\d+` met with the complement of `\\d+` generates no string
although Python's reading still takes `"٣"` beside ECMA's refusal. Such a node is no error where
the emitter can leave it out (a union branch, an optional member): that narrows only what is
generated, never the reduction a complement sees. The emptiness carries upwards exactly where a
value cannot avoid the node: an object whose required member's value generates nothing, an array
whose first `minItems` positions or required `contains` cannot be filled, a union all of whose
branches generate nothing, a reference to such a definition (or to one that is no value).
"""

from __future__ import annotations

from typing import Callable

from services.grammar.schema.nodes import (
    ArrayType,
    Node,
    NoValue,
    ObjectType,
    Ref,
    StringType,
    Union,
)


def generates_nothing(node: Node, defs: dict[str, Node],
                      string_nothing: Callable[[StringType], bool],
                      memo: dict[int, tuple[Node, bool]]) -> bool:
    """True only where every value `node` generates would need a part that generates nothing
    (never wrongly True: a reference met again while it is decided counts as generating)."""
    key = id(node)  # the node is kept in the memo beside its answer, so its id stays its own
    if key in memo:
        return memo[key][1]
    memo[key] = (node, False)  # in progress: a cycle through a reference is not taken as empty

    def nothing(n: Node) -> bool:
        return generates_nothing(n, defs, string_nothing, memo)

    if isinstance(node, NoValue):
        out = True
    elif isinstance(node, StringType):
        out = string_nothing(node)
    elif isinstance(node, Ref):
        target = defs.get(node.name)
        out = target is not None and nothing(target)
    elif isinstance(node, Union):
        out = all(nothing(b) for b in node.branches)
    elif isinstance(node, ObjectType):
        required = node.required_names
        out = any(k in required and nothing(v) for k, v in node.properties)
    elif isinstance(node, ArrayType):
        needed = [node.prefix[i] if i < len(node.prefix) else node.items
                  for i in range(min(node.min_items, len(node.prefix) + 1))]
        # `contains` needs one item that satisfies it in every array
        out = any(nothing(n) for n in needed) or (
            node.contains is not None and nothing(node.contains))
    else:
        out = False
    memo[key] = (node, out)
    return out
