"""The tool grammar of the Qwen3.5 XML format (literals and value rules: shared/frontends/formats/
qwen_xml.py), from the same `ToolSpec` as the Hermes grammar (services/grammar/tools/hermes.py).

A call is `Token(<tool_call>) "\\n<function=NAME>\\n" ARGS "</function>\\n" Token(</tool_call>)`;
further calls follow after one newline; once in the call sequence only further calls and EOS are
legal. The three independent choices of the design document:

- base structure: the opener and closer by token id (the only way to open a call: they are
  control tokens, so no text rule matches them and a spelled `<tool_call>` is text), the framing,
  and the allowed names;
- arguments: a strict tool's parameters in declared order, required ones present, each value a
  raw string (pure string parameters) or a JSON value of its schema (xml_values.py); a forced
  call to a non-strict tool follows its schema the same way (root closed to its declared
  properties: hermes.enforced_parameters), or the loose arguments below when that schema cannot
  be enforced exactly; any other non-strict tool's arguments are any parameters with any
  representable name (no '>' or line break) and any value text without the delimiter; that each
  name appears once in a call is the ParameterNameConstraint companion's part (param_names.py),
  not the grammar's, and so are a raw string's length bounds past what the delimiter automaton
  counts cheaply: the RawLengthConstraint companion's (raw_lengths.py, `counted_lengths`);
- call policy: `auto` = free text, then zero or more calls; `required` = one or more calls from
  the start; `parallel=False` = at most one call; `none` = free text that can never open a call.

A JSON content constraint together with tools under `auto` is the union: JSON content OR a call
sequence (the tool branch starts with the opener token, which no JSON value starts with).

`argument_codings` gives the worker's decoder the value contract the grammar was built from
(strict: which parameters are raw strings; non-strict: the declared types as hints), so grammar and
decoder never read the types separately.
"""

from __future__ import annotations

from services.grammar.regex.charset import ANY, CharSet, ebnf_class
from services.grammar.regex.tree import ebnf_literal
from services.grammar.schema import make_emitter, schema_to_ebnf, tool_argument_parts
from services.grammar.schema.context import child
from services.grammar.schema.nodes import NoValue, ObjectType, ReducedSchema
from services.grammar.tools.hermes import ToolSpec, embed, loose_fallback
from services.grammar.tools.xml_values import (
    JSON,
    MIXED,
    NEVER,
    RAW,
    RawStrings,
    parameter_kind,
    resolve,
)
from shared.contract import ConstraintKind, ToolDefinition, ToolMode
from shared.frontends.formats.qwen_xml import (
    CALL_CLOSE,
    CALL_HEAD,
    CALL_OPEN,
    CALL_SEPARATOR,
    CALL_TAIL,
    PARAM_OPEN,
    VALUE_END,
    ArgumentCoding,
    hint_coding,
    representable_name,
)
from shared.frontends.token_domain import TokenDomain

_NAME_CLASS = ebnf_class(CharSet.chars(">\n\r").invert())


def _strict_parameters(tool: ToolDefinition, index: int, prefix: str,
                       raw: RawStrings | None = None, *, schema: object = None
                       ) -> tuple[list[tuple[str, str, str, bool, tuple | None]], str]:
    """[(name, kind, value expression, required, counted bounds)] in declared order and the rules
    they use, of `schema` (default: the tool's parameters); counted bounds: the (min, max) a raw
    value leaves to the length companion (RawStrings.counted), else None.

    Raises InvalidSchema / UnsupportedSchema (source tool_arguments, the tool's index and name)
    for a root that is not a closed object, a parameter mixing string with other types, a name
    the framing cannot carry, or a raw value set that cannot be represented."""
    schema = tool.parameters if schema is None else schema
    reduced, graph, patterns, ctx = tool_argument_parts(schema, tool_index=index,
                                                        tool_name=tool.name)
    root = resolve(reduced.root, reduced)
    assert isinstance(root, ObjectType)
    shared = raw is not None
    raw = raw.bind(ctx, patterns) if raw is not None else RawStrings(prefix, ctx, patterns)
    required = root.required_names
    params: list[tuple[str, str, object, bool]] = []
    for name, node in root.properties:
        pointer = child("/properties", name)
        kind = parameter_kind(node, reduced)
        if kind == NEVER:
            if name in required:
                raise ctx.unsupported(pointer, f"required parameter {name!r} allows no value")
            continue
        if not representable_name(name):
            raise ctx.unsupported(pointer, f"parameter name {name!r} cannot be written in the XML "
                                  "format (it holds '>' or a line break)")
        if kind == MIXED:
            raise ctx.unsupported(pointer, f"parameter {name!r} mixes string with other types: "
                                  "its raw text cannot be told apart from a JSON value in the XML "
                                  "format")
        params.append((name, kind, node, name in required))
    json_props = tuple((n, node) for n, kind, node, _ in params if kind == JSON)
    emitter = make_emitter(ReducedSchema(ObjectType(json_props, (), NoValue()), reduced.defs),
                           graph, patterns, ctx)
    text = emitter.grammar()
    out = []
    for name, kind, node, req in params:
        pointer = child("/properties", name)
        if kind == JSON:
            out.append((name, kind, prefix + emitter.rule(node, 0), req, None))
        else:
            out.append((name, kind, raw.expression(node, reduced, pointer), req,
                        raw.counted(node, reduced, pointer)))
    body, _ = embed(text, prefix)
    rules = body if shared else body + "".join(f"{k} ::= {v}\n" for k, v in raw.rules.items())
    return out, rules


_NAME_END = ebnf_literal(">\n")
_VALUE_END = ebnf_literal(VALUE_END + "\n")


def _enforced(tool: ToolDefinition, index: int, forced: bool, raw: RawStrings | None = None):
    """`_strict_parameters` of the schema that constrains the tool's arguments, None when none
    does (a non-strict tool that is not forced, or forced with a schema that cannot be enforced
    exactly: its arguments are then the loose ones). A failed attempt leaves `raw` unchanged."""
    if not (tool.strict or forced):
        return None
    scratch = None if raw is None else raw.copy()

    def build(schema: object):
        return _strict_parameters(tool, index, f"t{index}_", scratch, schema=schema)

    built = loose_fallback(tool, forced, build)
    if built is not None and raw is not None:
        raw.adopt(scratch)
    return built


def _arguments(tool: ToolDefinition, index: int, raw: RawStrings,
               forced: bool) -> tuple[str, str]:
    """(ARGS expression, rules) of one tool; raw string rules go to the shared `raw`."""
    built = _enforced(tool, index, forced, raw)
    if built is None:
        return "xml_loose", ""
    params, rules = built
    parts = []
    for name, _, expr, req, _ in params:
        one = f"{ebnf_literal(PARAM_OPEN + name)} {_NAME_END} {expr} {_VALUE_END}"
        parts.append(f"({one})" if req else f"({one})?")
    return (" ".join(parts) if parts else '""'), rules


def _shared_rules(raw: RawStrings) -> str:
    """The rules every XML tool grammar may use: free text, loose (non-strict) parameters."""
    value = raw.unbounded()
    lines = [
        f'xml_free ::= "" | {ebnf_class(ANY)} xml_free',
        'xml_loose ::= "" | xml_lparam xml_loose',
        f"xml_lparam ::= {ebnf_literal(PARAM_OPEN)} xml_pname {_NAME_END} {value} {_VALUE_END}",
        f"xml_pname ::= {_NAME_CLASS}+",
    ]
    return "\n".join(lines) + "\n"


def xml_tool_grammar_ebnf(spec: ToolSpec, domain: TokenDomain) -> str:
    """The EBNF (entry `root`) of a tool spec in the XML format over `domain` (whose opener and
    closer control tokens the grammar names by id). Raises UnsupportedSchema / InvalidSchema
    (source tool_arguments, with the tool's index and name) for a strict tool's unusable schema,
    ValueError when the domain lacks the format's control tokens."""
    try:
        open_id, close_id = domain.special_id(CALL_OPEN), domain.special_id(CALL_CLOSE)
    except KeyError as e:
        raise ValueError(f"the vocabulary has no {e.args[0]!r} token") from None
    raw = RawStrings("xml_")  # raw string automata shared by every tool (content-named rules)
    lines: list[str] = [_shared_rules(raw)]
    index_of = {t.name: i for i, t in enumerate(spec.tools)}
    call_alts = []
    for tool in spec.allowed():
        args, rules = _arguments(tool, index_of[tool.name], raw, spec.forced)
        lines.append(rules)
        head = ebnf_literal(f"{CALL_HEAD}{tool.name}>\n")
        call_alts.append(f"Token({open_id}) {head} {args} {ebnf_literal(CALL_TAIL)} "
                         f"Token({close_id})")
    lines.append("".join(f"{k} ::= {v}\n" for k, v in raw.rules.items()))
    mode = spec.choice.mode
    if mode is ToolMode.NONE:
        top = "xml_free"
    else:
        lines.append("call ::= " + " | ".join(call_alts))
        sep = ebnf_literal(CALL_SEPARATOR)
        lines.append(f"calls ::= call ({sep} call)*" if spec.choice.parallel else "calls ::= call")
        if spec.content is not None:
            schema = {"type": "object"} if spec.content.kind is ConstraintKind.JSON_OBJECT \
                else spec.content.schema
            body, root = embed(schema_to_ebnf(schema, unique_names=True), "c_")
            lines.append(body)
            top = f"{root} | calls" if mode is ToolMode.AUTO else "calls"
        elif mode is ToolMode.AUTO:
            top = "xml_free | xml_free calls"
        else:
            top = "calls"
    return f"root ::= {top}\n" + "\n".join(lines) + "\n"


def argument_codings(tools: tuple[ToolDefinition, ...], *,
                     forced: bool = False) -> dict[str, ArgumentCoding]:
    """Tool name -> the value-decoding contract of the XML decoder: the raw string parameters of
    a tool whose schema constrains its arguments (classified exactly as its grammar is built; a
    forced call's too), a loose tool's declared types. Raises the grammar's schema errors for a
    strict tool it cannot build."""
    out: dict[str, ArgumentCoding] = {}
    for i, tool in enumerate(tools):
        built = _enforced(tool, i, forced)
        if built is None:
            out[tool.name] = hint_coding(tool.parameters)
            continue
        params, _ = built  # the grammar's own classification
        out[tool.name] = ArgumentCoding(strict=True,
                                        raw=frozenset(n for n, kind, *_ in params if kind == RAW))
    return out


def counted_lengths(tools: tuple[ToolDefinition, ...], *,
                    forced: bool = False) -> dict[str, dict[str, tuple[int, int | None]]]:
    """Tool name -> raw parameter -> the (min, max or None) length bounds its grammar leaves to
    the RawLengthConstraint companion (raw_lengths.py), for the tools whose schema constrains
    their arguments (built exactly as the grammar is); tools without such a value are absent.
    The grammar is exact only together with a companion of these bounds."""
    out: dict[str, dict[str, tuple[int, int | None]]] = {}
    for i, tool in enumerate(tools):
        built = _enforced(tool, i, forced)
        if built is None:
            continue
        bounds = {name: b for name, _, _, _, b in built[0] if b is not None}
        if bounds:
            out[tool.name] = bounds
    return out
