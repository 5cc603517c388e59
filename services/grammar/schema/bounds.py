"""Complements of schemas holding keywords that narrow in one reading only.

Such a keyword (another dialect's, READ_IN_EVERY_DIALECT; a near-miss read as meant; a format
read as the one it resembles) is an annotation for the declared dialect and an assertion for the
reading its author meant, so the two languages of its schema nest: enforced inside ignored. The
values generated must hold in both. A schema's language is monotone in every keyword that stands
under an even number of complements and antitone in the others, so `Reader` reads each
complemented schema as the other bound (`Reader.flipped`): the lower bound enforces the keyword,
the upper bound, taken under a complement, leaves it out (misspelt.declared_only). Under `not`
that is exactly the intersection of the readings (the complement of the wider one); a oneOf takes
"X_i and not X_j" with X_i's lower and X_j's upper bound, and proves exclusivity on the upper
bounds.

A definition is read once, in the bound that reached it first, so a reference under a complement
is sound only where no definition it reaches (transitively, in-document pointers) holds such a
keyword (`check_references`). Where one does, the reduction is made again with each definition
read once per bound (`Reader.split_bounds`, definitions named `<pointer> (upper bound)` in the
upper one); only then, so that every other schema keeps its grammar as it was.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from services.grammar.schema.refs import at_pointer

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader


class SplitBounds(Exception):
    """One bound per definition is not enough: reduce again with `split_bounds` (the
    UnsupportedSchema stands where that cannot be done)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


def check_references(r: "Reader") -> None:
    """Refuse a narrowing keyword of one reading inside a definition that a complemented
    schema's references reach (or anywhere, where a reference is not an in-document pointer).
    A complement taken inside a foreign applicator (draft-04's `if`) is exempt: the declared
    reading ignores the applicator whole, so its exact enforcement is the intersection."""
    original = r.ctx.original
    foreign = [original(f) for f in r.foreign]
    marked = sorted(set(foreign) | {original(f) for f in r.ignored})
    if not marked or r.split_bounds:
        return
    for at in sorted({original(c) for c in r.complemented}):
        if any(_under(at, f) for f in foreign):
            continue  # inside a foreign applicator, which the declared reading ignores whole
        reached = _reached(r.root, at)
        for key_at in marked:
            if reached is None or any(_under(key_at, d) for d in reached):
                raise SplitBounds(r.ctx.unsupported(
                    key_at, f"a keyword {r.doc.dialect.name} ignores (of another dialect, or a "
                    f"near-miss) in a definition a reference under a complement reaches (at "
                    f"{at or '/'}): the two readings differ there; declare the dialect with "
                    "$schema, or spell the keyword"))


def _under(pointer: str, root: str) -> bool:
    return pointer == root or pointer.startswith(root + "/") or root == ""


def _reached(root: Any, at: str) -> set[str] | None:
    """The pointers of the definitions the references below `at` reach, transitively (the
    schema at `at` itself not included unless a reference names it); None where a reference is
    not an in-document JSON pointer (an anchor, another document: it could reach anything)."""
    seen: set[str] = set()
    pending = _refs(at_pointer(root, at))
    while pending:
        ref = pending.pop()
        if not isinstance(ref, str) or not ref.startswith("#"):
            return None
        target = unquote(ref[1:])
        if target and not target.startswith("/"):
            return None
        if target in seen:
            continue
        seen.add(target)
        pending += _refs(at_pointer(root, target))
    return seen


def _refs(schema: Any) -> list:
    out, stack = [], [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "$ref" in node:
                out.append(node["$ref"])
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return out


