"""The tool contract for Hermes-style framing (the built-in default model's tool format; its
literals, rendering and parser live in shared/frontends/formats/hermes.py).

A call is the canonical text the chat template renders:

    <tool_call>\\n{"name": "NAME", "arguments": ARGS}\\n</tool_call>

Calls follow each other separated by one newline; once in the call sequence only further calls and
EOS are legal. The three independent choices of the design document:

- base structure: the framing and the declared (allowed) names are always enforced once a grammar
  is built; the free text before the first call under `auto` can never spell `<tool_call>` (the
  model's format has no dedicated token, so the opener is text: a spelled opener always starts a
  call, which is how the output decoder reads it too);
- arguments: a strict tool's ARGS is its argument schema's grammar (the root must reduce to a
  closed object); a forced call (`required`, a named choice) to a non-strict tool follows its
  schema too, with the root closed to its declared properties (`enforced_parameters`), and falls
  back to any JSON object when that schema cannot be enforced exactly; any other non-strict
  tool's ARGS is any JSON object;
- call policy: `auto` = free text then zero or more calls; `required` = one or more calls from the
  start; `parallel=False` = at most one call; `none` = content only (no grammar of its own).

A JSON content constraint together with tools under `auto` is the union: JSON content OR a call
sequence, never both. GBNF, choice and regex content constraints with an active tool set conflict.

The language is written twice, once per engine: `tool_grammar_ebnf` for xgrammar (the grammar of
record) and `tool_grammar_lark` for llguidance (the same envelope literals around the Lark
emission of the same schemas; which one compiles is `services.grammar.compiler.choose_engine`'s
rule, and tests/grammar/test_grammar_hermes_engines.py proves them equal).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from services.grammar.regex.tree import ebnf_literal
from shared.contract import (
    ConstraintKind,
    OutputConstraint,
    ToolChoice,
    ToolConstraints,
    ToolDefinition,
    ToolMode,
    canonical_json,
)
from shared.errors import ConflictingConstraint, InvalidSchema, SchemaSource, UnsupportedSchema
from shared.frontends.formats.hermes import (  # noqa: F401 - FRAMING and CALL_OPEN are public here
    ARGS_PREFIX,
    CALL_OPEN,
    CALL_SUFFIX,
    FRAMING,
    NAME_PREFIX,
)


@dataclass(frozen=True)
class ToolSpec:
    """Everything that defines a tool grammar. Non-strict schemas are part of its identity only
    when the choice forces a call (then they constrain the arguments)."""

    tools: tuple[ToolDefinition, ...]
    choice: ToolChoice
    content: OutputConstraint | None = None

    def allowed(self) -> tuple[ToolDefinition, ...]:
        names = self.choice.allowed_names
        return tuple(t for t in self.tools if names is None or t.name in names)

    @property
    def forced(self) -> bool:
        """The choice forces a call (`required`, a named choice, Anthropic `any`/`tool`): every
        tool's schema then constrains its arguments, strict or not."""
        return self.choice.mode is ToolMode.REQUIRED

    def schema_of(self, tool: ToolDefinition) -> object | None:
        """The schema that constrains `tool`'s arguments, None when nothing does."""
        return tool.parameters if tool.strict or self.forced else None

    def canonical_source(self) -> str:
        """The cache identity: allowed names, enforced schemas, call policy and content."""
        return canonical_json({
            "tools": [[t.name, t.strict, self.schema_of(t)] for t in self.allowed()],
            "mode": self.choice.mode.value,
            "parallel": self.choice.parallel,
            "content": None if self.content is None else
            [self.content.kind.value, self.content.canonical_source(), self.content.whitespace],
        })

    def to_json(self) -> str:
        """The spec as JSON text (what travels over gRPC); `from_json` reads it back."""
        c = self.content
        return canonical_json({
            "tools": [{"name": t.name, "strict": t.strict,
                       "parameters": self.schema_of(t)} for t in self.allowed()],
            "mode": self.choice.mode.value,
            "parallel": self.choice.parallel,
            "content": None if c is None else {"kind": c.kind.value, "source": c.source,
                                               "whitespace": c.whitespace},
        })

    @classmethod
    def from_json(cls, text: str) -> "ToolSpec":
        """Raises InvalidRequest (field "source") for text that is not a tool spec."""
        from shared.contract import parse_json_text
        from shared.errors import InvalidRequest

        data = parse_json_text(text, field="source")
        try:
            tools = tuple(ToolDefinition.create(t["name"], t["parameters"], strict=t["strict"],
                                                index=i) for i, t in enumerate(data["tools"]))
            choice = ToolChoice(ToolMode(data["mode"]), None, bool(data["parallel"]))
            content = data["content"]
            if content is not None:
                kind = ConstraintKind(content["kind"])
                ws = content.get("whitespace")
                content = OutputConstraint.json_object(whitespace=ws) \
                    if kind is ConstraintKind.JSON_OBJECT \
                    else OutputConstraint.json_schema(content["source"], whitespace=ws)
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidRequest(f"malformed tool spec: {exc}", field="source") from None
        return cls(tools, choice, content)


def needs_tool_grammar(tools: tuple[ToolDefinition, ...], choice: ToolChoice,
                       content: OutputConstraint | None, *, opener_is_token: bool = False) -> bool:
    """Whether a request's output language is a tool grammar (else: the content constraint alone,
    or free generation). Raises ConflictingConstraint for GBNF/choice/regex with active tools.

    `opener_is_token`: the model's format opens calls with a control token (Qwen XML). Then `none`
    without a content constraint is a grammar too, the free text that never opens a call ("None
    ... forbids generating the <tool_call> token"); a text opener (Hermes) cannot be forbidden
    that way and `none` stays free generation."""
    if not tools:
        return False
    if choice.mode is ToolMode.NONE:
        return opener_is_token and content is None
    if content is not None and content.kind not in (ConstraintKind.JSON_OBJECT,
                                                    ConstraintKind.JSON_SCHEMA):
        raise ConflictingConstraint(
            f"a {content.kind.value} constraint cannot be combined with active tools; use "
            "tool_choice none or drop the tools", field="tool_choice")
    if choice.constraints is ToolConstraints.AUTOMATIC:
        # Only what the request asks for: an ordinary auto turn with non-strict tools is free.
        asks = (choice.mode is ToolMode.REQUIRED or not choice.parallel
                or choice.allowed_names is not None or content is not None
                or any(t.strict for t in tools))
        return asks
    return True


def _text_without(word: str, prefix: str) -> tuple[str, dict[str, str]]:
    """Rules for any text that never contains `word` (a KMP automaton, one rule per state)."""
    from services.grammar.regex.charset import CharSet, ebnf_class

    n = len(word)
    fail = [0] * (n + 1)  # KMP failure function
    k = 0
    for i in range(1, n):
        while k and word[i] != word[k]:
            k = fail[k]
        if word[i] == word[k]:
            k += 1
        fail[i + 1] = k

    def step(state: int, ch: str) -> int:
        while state and word[state] != ch:
            state = fail[state]
        return state + 1 if word[state] == ch else 0

    rules: dict[str, str] = {}
    alphabet = sorted(set(word))
    others = ebnf_class(CharSet.chars("".join(alphabet)).invert().scalars())
    for s in range(n):
        alts = ['""']
        for ch in alphabet:
            nxt = step(s, ch)
            if nxt < n:
                alts.append(f"{ebnf_literal(ch)} {prefix}{nxt}")
        alts.append(f"{others} {prefix}0")
        rules[f"{prefix}{s}"] = " | ".join(alts)
    return f"{prefix}0", rules


_RULE_LINE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) ::= ", re.M)
_IDENT = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|[A-Za-z_][A-Za-z0-9_]*')


def embed(ebnf: str, prefix: str) -> tuple[str, str]:
    """Rename every rule of a whole grammar with `prefix` so several can live in one grammar.

    Returns (rules text, the renamed root). Literals and classes are left untouched."""
    names = set(_RULE_LINE.findall(ebnf))

    def rename(m: re.Match) -> str:
        tok = m.group(0)
        return prefix + tok if tok in names else tok

    return _IDENT.sub(rename, ebnf), prefix + "root"


def enforced_parameters(tool: ToolDefinition) -> object:
    """The schema a forced call's arguments follow: a strict tool's as given; a non-strict one's
    with the root object closed to its declared properties unless it says `additionalProperties`
    itself (every output still satisfies the schema, and a model that would keep inventing
    properties must end the call; a tool without parameters gets `{}`)."""
    schema = tool.parameters
    if tool.strict or not isinstance(schema, dict) or "additionalProperties" in schema:
        return schema
    if schema.get("type") != "object" and "properties" not in schema:
        return schema
    return {**schema, "additionalProperties": False}


def loose_fallback(tool: ToolDefinition, forced: bool, build):
    """`build(schema)` for a tool whose arguments follow a schema; for a forced non-strict tool
    whose schema cannot be enforced exactly, None (the caller's looser grammar: any arguments of
    the format), since the strict flag alone decides what is refused."""
    try:
        return build(enforced_parameters(tool))
    except (UnsupportedSchema, InvalidSchema):
        if tool.strict or not forced:
            raise
        return None


def _schema_text(tool: ToolDefinition, *, index: int, forced: bool, lark: bool) -> str:
    """The grammar text of `tool`'s arguments: xgrammar EBNF, or llguidance Lark (`lark`; raises
    emit.NeedsXgrammar for a schema form only the EBNF emission writes)."""
    from services.grammar.schema import reduce_tool_arguments, schema_to_ebnf, schema_to_lark

    emit = schema_to_lark if lark else schema_to_ebnf

    def build(schema: object) -> str:
        reduce_tool_arguments(schema, tool_index=index, tool_name=tool.name)
        return emit(schema, source=SchemaSource.TOOL_ARGUMENTS, tool_index=index,
                    tool_name=tool.name, unique_names=True)

    if not (tool.strict or forced):
        return emit({"type": "object"})
    text = loose_fallback(tool, forced, build)
    return emit({"type": "object"}) if text is None else text


def _content_schema(spec: ToolSpec) -> object:
    assert spec.content is not None
    return {"type": "object"} if spec.content.kind is ConstraintKind.JSON_OBJECT \
        else spec.content.schema


def tool_grammar_ebnf(spec: ToolSpec, *, whitespace: str = "any") -> str:
    """The EBNF (entry `root`) of a tool spec; `whitespace` is the JSON content's profile (tool
    arguments always use `any`). Raises UnsupportedSchema / InvalidSchema (source tool_arguments,
    with the tool's index and name) for a strict tool's unusable schema."""
    lines: list[str] = []
    call_alts = []
    index_of = {t.name: i for i, t in enumerate(spec.tools)}
    for tool in spec.allowed():
        i = index_of[tool.name]
        body, root = embed(_schema_text(tool, index=i, forced=spec.forced, lark=False), f"t{i}_")
        lines.append(body)
        head = ebnf_literal(f"{CALL_OPEN}\n{NAME_PREFIX}{tool.name}{ARGS_PREFIX}")
        call_alts.append(f"{head} {root} {ebnf_literal(CALL_SUFFIX)}")
    lines.append("call ::= " + " | ".join(call_alts))
    if spec.choice.parallel:
        lines.append('calls ::= call ("\\n" call)*')
    else:
        lines.append("calls ::= call")
    mode = spec.choice.mode
    if spec.content is not None:
        from services.grammar.schema import schema_to_ebnf

        body, root = embed(schema_to_ebnf(_content_schema(spec), whitespace=whitespace,
                                          unique_names=True), "c_")
        lines.append(body)
        top = f"{root} | calls" if mode is ToolMode.AUTO else "calls"
    elif mode is ToolMode.AUTO:
        free, rules = _text_without(CALL_OPEN, "free")
        lines.extend(f"{k} ::= {v}" for k, v in rules.items())
        top = f"{free} | {free} calls"
    else:
        top = "calls"
    return f"root ::= {top}\n" + "\n".join(lines) + "\n"


def tool_grammar_lark(spec: ToolSpec, *, whitespace: str = "any") -> str:
    """The language of `tool_grammar_ebnf` as llguidance Lark (entry `start`): the same envelope
    literals around each tool's argument grammar and the JSON content's, written by the Lark
    emission of the same schemas. Each call's opener is its own lexeme and its name head another,
    so that no lexeme boundary is ambiguous for llguidance's greedy lexer; the free text before a
    first call under `auto` is one lexeme that ends with the first spelled opener (`FREE_OPEN`),
    or runs to the end of the output (`FREE`). Raises what `tool_grammar_ebnf` raises, and
    emit.NeedsXgrammar for an argument or content schema form only the EBNF emission writes."""
    from services.grammar.engines.lark import embed_lark, lark_literal

    lines: list[str] = []
    tails = []
    index_of = {t.name: i for i, t in enumerate(spec.tools)}
    for tool in spec.allowed():
        i = index_of[tool.name]
        text = _schema_text(tool, index=i, forced=spec.forced, lark=True)
        body, root = embed_lark(text, f"t{i}_")
        lines.append(body)
        head = lark_literal(f"\n{NAME_PREFIX}{tool.name}{ARGS_PREFIX}")
        tails.append(f"{head} {root} {lark_literal(CALL_SUFFIX)}")
    lines.append("call_tail: " + " | ".join(tails))
    more = f" ({lark_literal(chr(10) + CALL_OPEN)} call_tail)*" if spec.choice.parallel else ""
    calls = f"{lark_literal(CALL_OPEN)} call_tail{more}"
    mode = spec.choice.mode
    if spec.content is not None:
        from services.grammar.schema import schema_to_lark

        body, root = embed_lark(schema_to_lark(_content_schema(spec), whitespace=whitespace,
                                               unique_names=True),
                                "c_")
        lines.append(body)
        top = f"{root} | {calls}" if mode is ToolMode.AUTO else calls
    elif mode is ToolMode.AUTO:
        from services.grammar.engines.lark import rust_regex
        from services.grammar.regex.tree import Literal

        opener = rust_regex(Literal(CALL_OPEN))
        free = f"/(?s:.*)/ & ~/(?s:.*){opener}(?s:.*)/"
        lines.append(f"FREE: {free}")
        lines.append(f"FREE_OPEN: ({free}) {lark_literal(CALL_OPEN)}")
        top = f"FREE | FREE_OPEN call_tail{more}"
    else:
        top = calls
    return ('%llguidance {"no_forcing": true}\n'
            f"start: {top}\n" + "\n".join(lines) + "\n")
