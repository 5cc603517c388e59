"""A JSON value written in a schema grammar's generation layout, for checking instances.

The grammar of a schema fixes a layout (declared properties first, in declared order, then the
other members; canonical string escapes; integers and plain decimals; no required whitespace), so a
valid instance in another member order or number spelling is still valid but not in the language.
`layout_text` writes a value the way the grammar generates it: an object's members are ordered by
the object node the value belongs to (for a union, the first branch that holds the value), numbers
are written as integers or plain decimals (a float keeps its fraction). It only reorders and
respells; it never changes a value, so whether the text is accepted is still the grammar's
decision.
"""

from __future__ import annotations

import json
from decimal import Decimal
from typing import Any, Callable

from services.grammar.schema.nodes import ArrayType, Literals, Node, ObjectType, Ref, Union


def _number(v: int | float) -> str:
    """Integers as integers; floats as plain decimals that keep a fraction ("12345.0" stays a
    decimal: draft-04 does not count it as an integer, so respelling it would change the value)."""
    if isinstance(v, int):
        return str(v)
    text = format(Decimal(repr(v)), "f")
    return text if "." in text else text + ".0"


def layout_text(node: Node, value: Any, defs: dict[str, Node],
                member: Callable[[Node, Any], bool], depth: int = 0,
                value_of: Callable[[ObjectType, str], Node] | None = None) -> str:
    """`value` as JSON text in the layout of `node`; `member(node, value)` decides membership,
    `value_of(object, name)` the schema of a member (default: declared or additional)."""
    value_of = value_of or (lambda obj, k: obj.value_of(k))
    while isinstance(node, Ref) and depth < 256:
        node = defs[node.name]
        depth += 1
    if isinstance(node, Union):
        chosen = next((b for b in node.branches if member(b, value)), None)
        if chosen is not None:
            return layout_text(chosen, value, defs, member, depth + 1, value_of)
    if isinstance(node, Literals):
        for text in node.texts:
            lit = json.loads(text)
            if member(Literals((text,)), value):
                return _plain(lit)
    if isinstance(value, dict):
        if isinstance(node, ObjectType):
            declared = [k for k, _ in node.properties if k in value]
            rest = [k for k in value if k not in dict(node.properties)]
            parts = [
                f"{json.dumps(k, ensure_ascii=False)}:"
                f"{layout_text(value_of(node, k), value[k], defs, member, depth + 1, value_of)}"
                for k in declared + rest
            ]
            return "{" + ",".join(parts) + "}"
        return _plain(value)
    if isinstance(value, list):
        if isinstance(node, ArrayType):
            items = [layout_text(node.prefix[i] if i < len(node.prefix) else node.items, x, defs,
                                 member, depth + 1, value_of) for i, x in enumerate(value)]
            return "[" + ",".join(items) + "]"
        return _plain(value)
    return _plain(value)


def _plain(value: Any) -> str:
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (int, float)):
        return _number(value)
    if isinstance(value, list):
        return "[" + ",".join(_plain(x) for x in value) + "]"
    return (
        "{"
        + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_plain(v)}" for k, v in value.items())
        + "}"
    )
