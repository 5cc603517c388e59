"""Which JSON an output language writes admits undeclared member names: whether the JSON name
companion (json_names.py) must run beside a grammar, and whether it must probe (where
patternProperties or propertyNames restrict the undeclared names). Read from the same reduced
schemas the grammars are emitted from, with the grammars' own choice of schema per tool."""

from __future__ import annotations

from functools import lru_cache


@lru_cache(maxsize=256)
def content_names(constraint) -> tuple[bool, bool]:
    """(JSON content admits undeclared names, some object restricts them: probe) of a content
    constraint; (False, False) for a constraint that is not JSON."""
    from services.grammar.schema import check_schema
    from shared.contract import ConstraintKind

    if constraint.kind is ConstraintKind.JSON_OBJECT:
        return True, False
    if constraint.kind is not ConstraintKind.JSON_SCHEMA:
        return False, False
    return _free_names(check_schema(constraint.schema, unique_names=True, unique_items=True))


def hermes_names(spec) -> tuple[bool, bool]:
    """`_free_names` over the arguments of every Hermes call the spec allows (the grammar's own
    choice of schema: hermes.loose_fallback; a non-strict tool's arguments are any object)."""
    from services.grammar.tools.hermes import loose_fallback

    free = probe = False
    index_of = {t.name: i for i, t in enumerate(spec.tools)}
    for tool in spec.allowed():
        reduced = None
        if tool.strict or spec.forced:
            reduced = loose_fallback(tool, spec.forced,
                                     lambda schema: _tool_schema(schema, index_of[tool.name], tool))
        f, p = (True, False) if reduced is None else _free_names(reduced)
        free, probe = free or f, probe or p
    return free, probe


def xml_json_params(spec) -> dict:
    """Function name -> its JSON-valued parameters (UTF-8 bytes), for the XML calls the spec
    allows (the grammar's own classification: xml_tools.argument_codings), and under None the
    `_free_names` of those tools' schemas; {} when no call has a JSON value."""
    from services.grammar.tools.hermes import enforced_parameters
    from services.grammar.tools.xml_tools import argument_codings
    from services.grammar.tools.xml_values import resolve

    codings = argument_codings(spec.allowed(), forced=spec.forced)
    index_of = {t.name: i for i, t in enumerate(spec.tools)}
    params: dict = {}
    free = probe = False
    for tool in spec.allowed():
        coding = codings[tool.name]
        if not coding.strict:
            continue  # loose arguments: free text, no JSON
        reduced = _tool_schema(enforced_parameters(tool), index_of[tool.name], tool)
        root = resolve(reduced.root, reduced)
        names = [n for n, _ in getattr(root, "properties", ()) if n not in coding.raw]
        if not names:
            continue
        params[tool.name.encode()] = frozenset(n.encode() for n in names)
        f, p = _free_names(reduced)  # the root is closed: its JSON values' objects count
        free, probe = free or f, probe or p
    if params:
        params[None] = (free, probe)
    return params


def _tool_schema(schema, index: int, tool):
    from services.grammar.schema import check_schema
    from shared.errors import SchemaSource

    return check_schema(schema, source=SchemaSource.TOOL_ARGUMENTS, tool_index=index,
                        tool_name=tool.name, unique_names=True)


def _free_names(reduced) -> tuple[bool, bool]:
    """(some object of the reduced schema admits undeclared names, some object restricts them
    by patternProperties or propertyNames: the companion must probe)."""
    from services.grammar.schema.nodes import (
        AnyValue,
        ArrayType,
        NoValue,
        ObjectType,
        Ref,
        Union,
    )

    seen: set[int] = set()
    stack = [reduced.root]
    free = probe = False
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, AnyValue):
            free = True
        elif isinstance(node, Ref):
            stack.append(reduced.defs[node.name])
        elif isinstance(node, Union):
            stack.extend(node.branches)
        elif isinstance(node, ArrayType):
            stack.extend((*node.prefix, node.items, *(() if node.contains is None
                                                      else (node.contains,))))
        elif isinstance(node, ObjectType):
            if not isinstance(node.names, NoValue) and (
                    node.patterns or not isinstance(node.additional, NoValue)):
                free = True
                probe = probe or bool(node.patterns) or not isinstance(node.names, AnyValue)
            stack.extend(v for _, v in node.properties)
            stack.append(node.additional)
            stack.extend(v for _, v in node.patterns)
    return free, probe
