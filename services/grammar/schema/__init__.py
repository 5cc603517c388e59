"""JSON Schema -> xgrammar Grammar: a schema is either enforced completely or rejected.

`check_schema` validates the caller's schema and reduces its compositions (no xgrammar involved);
`schema_to_grammar` emits our own EBNF for the reduced graph (xgrammar's converter silently loosens
several rules, e.g. it drops keywords it does not enforce); `json_object_grammar` is the json_object
mode.
Errors are InvalidSchema (not a valid schema) or UnsupportedSchema (valid, outside the enforced
subset), each with the RFC 6901 pointer into the caller's schema and the source/tool.
"""

from __future__ import annotations

from typing import Any

import xgrammar as xgr

from services.grammar.schema.algebra import Graph
from services.grammar.schema.arrays import extended
from services.grammar.schema.bounds import SplitBounds
from services.grammar.schema.context import Context
from services.grammar.schema.emit import Emitter
from services.grammar.schema.layout import layout_text
from services.grammar.schema.lengths import counted_strings, unbounded
from services.grammar.schema.nodes import (
    ArrayType,
    Literals,
    NoValue,
    ObjectType,
    ReducedSchema,
    Ref,
    StringType,
    Union,
)
from services.grammar.schema.patterns import PatternSupport
from services.grammar.schema.reader import Reader
from services.grammar.schema.regex_json import lower
from services.settings import switch
from shared.errors import (
    ConstraintTooComplex,
    InternalError,
    InvalidSchema,
    SchemaSource,
    UnsupportedSchema,
)


def _context(source: SchemaSource, tool_index: int | None, tool_name: str | None,
             unique_names: bool = False, unique_items: bool = False) -> Context:
    return Context(SchemaSource(source), tool_index, tool_name, unique_names=unique_names,
                   unique_items=unique_items)


def _reduce(schema: Any, ctx: Context, patterns: PatternSupport) -> ReducedSchema:
    return _reduce_graph(schema, ctx, patterns)[0]


def _reduce_graph(
    schema: Any, ctx: Context, patterns: PatternSupport
) -> tuple[ReducedSchema, Graph]:
    try:
        graph, reader, root = _read(schema, ctx, patterns, split_bounds=False)
    except SplitBounds:  # a definition is needed in both bounds (bounds.py)
        ctx.merges = 0
        graph, reader, root = _read(schema, ctx, patterns, split_bounds=True)
    reduced = ReducedSchema(root, graph.defs, tuple(sorted(reader.annotations)))
    _finalize(reduced, ctx, patterns)
    if ctx.unique_items_at is not None:
        from services.grammar.schema.unique_items import check_positions

        check_positions(graph, root, ctx, ctx.unique_items_at)
    if isinstance(graph.resolve(root, ""), NoValue):
        why = "" if graph.first_empty is None else \
            f"; the first string found to match nothing: {graph.first_empty!r}"
        raise ctx.unsupported("", f"the schema accepts no JSON value (unsatisfiable{why})")
    return reduced, graph


def _read(schema: Any, ctx: Context, patterns: PatternSupport,
          split_bounds: bool) -> tuple[Graph, Reader, Any]:
    graph = Graph(ctx, patterns.matches, patterns.empty, patterns.pattern_check)
    reader = Reader(schema, ctx, graph)
    reader.split_bounds = split_bounds
    root = reader.read(schema)
    graph.finish()
    patterns.defs = graph.defs
    reader.check_foreign_complements()
    return graph, reader, root


def _finalize(reduced: ReducedSchema, ctx: Context, patterns: PatternSupport) -> None:
    """Checks on the reduced graph: required names declared; string patterns compilable."""
    seen: set[int] = set()
    # what the emitter reaches from the root (a definition only met inside a left-out branch,
    # such as a meet with a complement that generates nothing, is never emitted)
    stack: list[Any] = [reduced.root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Ref):
            stack.append(reduced.defs[node.name])
        elif isinstance(node, Union):
            kept = [b for b in node.branches if not patterns.generates_nothing(b)]
            stack.extend(kept or node.branches)  # the emitter leaves the others out
        elif isinstance(node, ArrayType):
            stack.extend(node.prefix)
            stack.append(node.items)
            if node.contains is not None:
                stack.append(node.contains)
        elif isinstance(node, ObjectType):
            declared = {k for k, _ in node.properties}
            for r in node.required:  # Graph.object_type declares every required name
                assert r.name in declared, r
            # an optional member whose value generates nothing is left out by the emitter
            stack.extend(v for k, v in node.properties
                         if k in node.required_names or not patterns.generates_nothing(v))
            stack.append(node.additional)
            if node.extended:
                stack.extend(v for _, v in patterns.regions(node))
        elif isinstance(node, StringType) and node.patterns:
            patterns.check(node, ctx)


# The emitted grammar's size limit, checked inside the conversion before xgrammar sees the text:
# beyond it xgrammar's compile takes minutes (a 47 MB grammar of 75,000 rules from nested oneOf
# complements was measured), and a compile in a thread cannot be stopped. An operator setting
# (INFERNIX_MAX_GRAMMAR_BYTES, read when a schema converts, also in compile child processes).
def max_grammar_bytes() -> int:
    return switch("max_grammar_bytes")


def make_emitter(reduced: ReducedSchema, graph: Graph, patterns: PatternSupport, ctx: Context, *,
                 syntax: str = "xgrammar", whitespace: str = "any",
                 explicit_layout: bool = False) -> Emitter:
    """The one way to build an Emitter over a reduction (`_reduce_graph`'s schema and graph): the
    content schema path and the XML tool format's JSON parameter values both use it."""

    def pattern_tree(node: StringType) -> Any:
        patterns.check(node, ctx)
        body = lower(patterns.tree(node.patterns[0]))
        assert body is not None  # check() refused empty languages
        return body

    return Emitter(reduced, pattern_tree, syntax=syntax, whitespace=whitespace,
                   pattern_ebnf=patterns.ebnf, one_pattern=patterns.tree_only,
                   generates_nothing=patterns.generates_nothing,
                   extended=lambda em, node: extended(em, node, graph, patterns.regions),
                   explicit_layout=explicit_layout, context=ctx)


def _emit(schema: Any, source: SchemaSource, tool_index: int | None, tool_name: str | None,
          syntax: str, whitespace: str, explicit_layout: bool, unique_names: bool = False,
          unique_items: bool = False, counted_lengths: bool = False) -> str:
    """The grammar text in `syntax` ("xgrammar" EBNF or "llguidance" Lark). Raises the schema's
    typed errors, ConstraintTooComplex past `max_grammar_bytes()`, and emit.NeedsXgrammar for a
    Lark emission of an xgrammar-only form. `unique_names`: the consumer runs the JSON name
    companion (services/grammar/json_names.py), so counts of undeclared names compile.
    `counted_lengths`: the consumer runs the JSON length companion (services/grammar/
    json_lengths.py), so the strings of `lengths.counted_strings` are written unbounded."""
    ctx = _context(source, tool_index, tool_name, unique_names, unique_items)
    patterns = PatternSupport(ctx)
    reduced, graph = _reduce_graph(schema, ctx, patterns)
    if counted_lengths:
        root = unbounded(reduced.root, counted_strings(reduced.root))
        reduced = ReducedSchema(root, reduced.defs, reduced.annotations)
    text = make_emitter(reduced, graph, patterns, ctx, syntax=syntax, whitespace=whitespace,
                        explicit_layout=explicit_layout).grammar()
    limit = max_grammar_bytes()
    if len(text) > limit:
        raise ConstraintTooComplex(f"the schema's grammar would be {len(text):,} bytes (limit "
                                   f"{limit:,}, INFERNIX_MAX_GRAMMAR_BYTES): too large to compile",
                                   limit="max_grammar_bytes", value=limit)
    return text


def check_schema(schema: Any, *, source: SchemaSource = SchemaSource.CONTENT,
                 tool_index: int | None = None, tool_name: str | None = None,
                 unique_names: bool = False, unique_items: bool = False) -> ReducedSchema:
    """Validate and reduce `schema` (a parsed JSON object or boolean); no xgrammar involved.
    `unique_names`, `unique_items`: as for `schema_to_grammar`.

    Raises InvalidSchema / UnsupportedSchema with the pointer into `schema`."""
    ctx = _context(source, tool_index, tool_name, unique_names, unique_items)
    return _reduce(schema, ctx, PatternSupport(ctx))


def reduce_tool_arguments(schema: Any, *, tool_index: int, tool_name: str) -> ReducedSchema:
    """The reduction of a strict tool's argument schema, whose root must reduce to a closed object
    (type=object, additionalProperties=false), possibly through $ref or allOf.

    Raises InvalidSchema / UnsupportedSchema with source=TOOL_ARGUMENTS."""
    return tool_argument_parts(schema, tool_index=tool_index, tool_name=tool_name)[0]


def tool_argument_parts(schema: Any, *, tool_index: int, tool_name: str
                        ) -> tuple[ReducedSchema, Graph, PatternSupport, Context]:
    """`reduce_tool_arguments` with what `make_emitter` needs to write its values' grammar.
    Tool grammars run with the JSON name companion (json_names.tool_json_names_for), so counts
    of undeclared names compile (`unique_names`)."""
    src = SchemaSource.TOOL_ARGUMENTS
    ctx = _context(src, tool_index, tool_name, unique_names=True)
    patterns = PatternSupport(ctx)
    reduced, graph = _reduce_graph(schema, ctx, patterns)
    root = reduced.root
    while isinstance(root, Ref):
        root = reduced.defs[root.name]
    if not isinstance(root, ObjectType):
        kind = "a finite value set" if isinstance(root, Literals) else \
            "a union" if isinstance(root, Union) else "not an object"
        raise ctx.unsupported("", f"a strict tool's argument schema must reduce to type=object; "
                                  f"it reduces to {kind}")
    if root.extended:
        raise ctx.unsupported("", "a strict tool's argument object with patternProperties, "
                                  "propertyNames or property counts is not supported")
    if not isinstance(root.additional, NoValue):
        where = "/additionalProperties" if isinstance(schema, dict) and \
            "additionalProperties" in schema else ""
        raise ctx.unsupported(where, "a strict tool's argument object needs "
                                     "additionalProperties=false")
    return ReducedSchema(root, reduced.defs, reduced.annotations), graph, patterns, ctx


def schema_to_grammar(schema: Any, *, source: SchemaSource = SchemaSource.CONTENT,
                      tool_index: int | None = None, tool_name: str | None = None,
                      whitespace: str = "any", explicit_layout: bool = False,
                      unique_names: bool = False, unique_items: bool = False,
                      counted_lengths: bool = False) -> xgr.Grammar:
    """A Grammar whose language is exactly the schema's instances in the generation layout
    (declared property order, whitespace as the profile says: `emit.WHITESPACE_PROFILES`;
    `explicit_layout`: the profile was requested, so a form that cannot keep it is refused;
    `unique_names`: every consumer runs the JSON name companion, see `_emit`; `unique_items`:
    every consumer runs the unique-items companion, services/grammar/unique_items.py, so
    uniqueItems over scalar items compiles: content only, never a tool grammar;
    `counted_lengths`: every consumer runs the JSON length companion, see `_emit`).

    Raises InvalidSchema / UnsupportedSchema (pointer into `schema`, source, tool info)."""
    text = schema_to_ebnf(schema, source=source, tool_index=tool_index, tool_name=tool_name,
                          whitespace=whitespace, explicit_layout=explicit_layout,
                          unique_names=unique_names, unique_items=unique_items,
                          counted_lengths=counted_lengths)
    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as exc:  # our emitter produced text xgrammar refuses: our bug
        raise InternalError(f"schema grammar did not parse: {exc}") from None


def schema_to_ebnf(schema: Any, *, source: SchemaSource = SchemaSource.CONTENT,
                   tool_index: int | None = None, tool_name: str | None = None,
                   whitespace: str = "any", explicit_layout: bool = False,
                   unique_names: bool = False, unique_items: bool = False,
                   counted_lengths: bool = False) -> str:
    """The xgrammar EBNF text `schema_to_grammar` compiles (entry rule `root`)."""
    return _emit(schema, source, tool_index, tool_name, "xgrammar", whitespace, explicit_layout,
                 unique_names, unique_items, counted_lengths)


def schema_to_lark(schema: Any, *, source: SchemaSource = SchemaSource.CONTENT,
                   tool_index: int | None = None, tool_name: str | None = None,
                   whitespace: str = "any", explicit_layout: bool = False,
                   unique_names: bool = False, unique_items: bool = False,
                   counted_lengths: bool = False) -> str:
    """The same language as llguidance Lark text (entry rule `start`). Raises emit.NeedsXgrammar
    for a schema form only the xgrammar emission writes."""
    return _emit(schema, source, tool_index, tool_name, "llguidance", whitespace, explicit_layout,
                 unique_names, unique_items, counted_lengths)


def layout_values(schema: Any, values: list[Any]) -> list[str]:
    """Each value as JSON text in the generation layout of `schema` (see `layout.layout_text`);
    for checking instances against the compiled grammar (content, which runs with the JSON name
    companion). Raises what `check_schema` raises."""
    ctx = _context(SchemaSource.CONTENT, None, None, unique_names=True, unique_items=True)
    reduced, graph = _reduce_graph(schema, ctx, PatternSupport(ctx))

    def member(node: Any, value: Any) -> bool:
        try:
            return graph.matches(node, value, "")
        except (UnsupportedSchema, InvalidSchema):
            return False

    def value_of(obj: Any, name: str) -> Any:
        try:
            return graph.value_of(obj, name, "")
        except (UnsupportedSchema, InvalidSchema):
            return obj.value_of(name)

    return [layout_text(reduced.root, v, reduced.defs, member, 0, value_of) for v in values]


def companion_positions(schema: Any) -> Any:
    """The value positions (schema/unique_items.py `Positions`) of a content schema with arrays
    left to the unique-items companion, else None. Raises what `check_schema` raises."""
    from services.grammar.schema.unique_items import Positions

    ctx = _context(SchemaSource.CONTENT, None, None, unique_names=True, unique_items=True)
    reduced, graph = _reduce_graph(schema, ctx, PatternSupport(ctx))
    return None if ctx.unique_items_at is None else Positions(graph, reduced.root)


def json_object_grammar(whitespace: str = "any") -> xgr.Grammar:
    """Any JSON object at the root (json_object mode), same layout as schema grammars."""
    return schema_to_grammar({"type": "object"}, whitespace=whitespace)


__all__ = [
    "ReducedSchema",
    "check_schema",
    "companion_positions",
    "json_object_grammar",
    "layout_values",
    "make_emitter",
    "reduce_tool_arguments",
    "schema_to_ebnf",
    "schema_to_grammar",
    "schema_to_lark",
    "tool_argument_parts",
]
