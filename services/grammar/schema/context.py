"""Where a schema came from and how to report what is wrong with it (RFC 6901 pointers)."""

from __future__ import annotations

from dataclasses import dataclass, field

from shared.errors import InvalidSchema, SchemaSource, UnsupportedSchema

# Limits of the composition reduction (design document, "Composition compilation has explicit
# limits").
MAX_MERGES = 16384  # intersection merges per reduction
MAX_DEPTH = 256  # nesting / finite-value recursion depth


def child(pointer: str, token: str | int) -> str:
    """`pointer` extended by one reference token, escaped per RFC 6901."""
    text = str(token).replace("~", "~0").replace("/", "~1")
    return f"{pointer}/{text}"


@dataclass
class Context:
    """The error factory of one reduction: every error names source, tool and pointer."""

    source: SchemaSource = SchemaSource.CONTENT
    tool_index: int | None = None
    tool_name: str | None = None
    merges: int = 0
    # The consumer keeps member names unique (json_names.JsonNameConstraint runs beside the
    # matcher): a count of undeclared names is then a count of distinct members.
    unique_names: bool = False
    # The consumer keeps items of unique arrays unique (unique_items.UniqueItemsConstraint: JSON
    # content only), so uniqueItems over scalar items compiles; the first such uniqueItems
    # pointer, whose positions are checked after the reduction.
    unique_items: bool = False
    unique_items_at: str | None = None
    # Pointers read under another key than the source's (a misspelt keyword read as the one it
    # resembles, misspelt.py): the read pointer -> the source's, so errors name the source.
    aliases: dict[str, str] = field(default_factory=dict)

    def original(self, pointer: str) -> str:
        """`pointer` as the source spells it (longest alias first: an alias may lie inside
        another)."""
        for read in sorted(self.aliases, key=len, reverse=True):
            if pointer == read or pointer.startswith(read + "/"):
                pointer = self.aliases[read] + pointer[len(read):]
        return pointer

    def _where(self, pointer: str) -> str:
        where = f"at {pointer!r}" if pointer else "at the schema root"
        if self.source is SchemaSource.TOOL_ARGUMENTS:
            where += f" of tool {self.tool_index} ({self.tool_name!r}) arguments"
        return where

    def invalid(self, pointer: str, message: str) -> InvalidSchema:
        pointer = self.original(pointer)
        return InvalidSchema(
            f"invalid JSON Schema {self._where(pointer)}: {message}",
            pointer=pointer,
            source=self.source,
            tool_index=self.tool_index,
            tool_name=self.tool_name,
        )

    def unsupported(self, pointer: str, message: str) -> UnsupportedSchema:
        pointer = self.original(pointer)
        return UnsupportedSchema(f"unsupported JSON Schema {self._where(pointer)}: {message}",
                                 pointer=pointer, source=self.source, tool_index=self.tool_index,
                                 tool_name=self.tool_name)

    def count_merge(self, pointer: str) -> None:
        self.merges += 1
        if self.merges > MAX_MERGES:
            raise self.unsupported(pointer, f"the composition needs more than {MAX_MERGES} "
                                            "intersection merges")
