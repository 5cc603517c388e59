"""Applicators and assertions beyond the core subset, each enforced only where it reduces exactly.

`apply(reader, schema, node, pointer, depth)` meets `node` (the schema object's reduction so far)
with the keywords below; anything that does not reduce exactly is an UnsupportedSchema at its
pointer.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from services.grammar.schema.nodes import Node

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader

KEYWORDS: frozenset[str] = frozenset()


def apply(r: "Reader", s: dict, node: Node, pointer: str, depth: int) -> Node:
    return node


__all__ = ["KEYWORDS", "apply", "Any"]
