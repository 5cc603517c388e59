"""The public request contract: output constraints, tool declarations and the tool-call policy.

Pure data with no third-party types. Constructors check shape only (types, emptiness); the
grammar service validates the language itself (GBNF syntax, regex constructs, schema subset).
"""

from __future__ import annotations

import json
import math
import re
import uuid
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from typing import Any, Mapping, Sequence

from shared.errors import InvalidChoice, InvalidRequest, InvalidToolDefinition


class ConstraintKind(str, Enum):
    GRAMMAR = "grammar"  # GBNF text, entry rule `root`
    JSON_OBJECT = "json_object"  # any JSON object at the root
    JSON_SCHEMA = "json_schema"  # a JSON Schema document (supported subset)
    CHOICE = "choice"  # a finite set of literal strings
    REGEX = "regex"  # a whole-content ECMAScript-style regex


# JSON whitespace profiles (JSON kinds only): `any` = runs of at most 32 whitespace characters
# between tokens, `compact` = none, `indented` = the canonical 2-space layout; None = the model's
# default (services.grammar.compiler.DEFAULT_WHITESPACE).
JSON_WHITESPACE = ("any", "compact", "indented")


def _whitespace(value: str | None) -> str | None:
    if value is not None and value not in JSON_WHITESPACE:
        raise InvalidRequest(f"whitespace must be one of {', '.join(JSON_WHITESPACE)}, got "
                             f"{value!r}", field="whitespace")
    return value


class RoundedNumber(float):
    """A JSON number that binary64 parsing rounds (its decimal value is not that of the float's
    shortest text, e.g. 0.10000000000000000000001 or 12345678901234567891234.5): the float, with
    the text as written. Schema readers refuse it where it asserts (a bound, const/enum); JSON
    written by `canonical_json` keeps the text, so the source stays what the client sent."""

    text: str

    def __new__(cls, text: str) -> "RoundedNumber":
        obj = super().__new__(cls, text)
        obj.text = text
        return obj


def read_float(text: str) -> float:
    """`json.loads`'s parse_float: a finite float, or a RoundedNumber where parsing rounds the
    decimal value. Raises ValueError for a number beyond binary64's range (1e400)."""
    value = float(text)
    if math.isinf(value):
        raise ValueError(f"the number {text[:40]} is out of the range of a double")
    if Decimal(text) != Decimal(repr(value)):
        return RoundedNumber(text)
    return value


def _has_rounded(value: Any) -> bool:
    if isinstance(value, RoundedNumber):
        return True
    if isinstance(value, dict):
        return any(_has_rounded(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_rounded(v) for v in value)
    return False


def canonical_json(value: Any) -> str:
    """Order-preserving compact JSON: the declared property order is part of a schema's meaning.
    RoundedNumbers are written as their own text."""
    if not _has_rounded(value):
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    texts: list[str] = []
    mark = f"\ue000rounded-{uuid.uuid4().hex}-"

    def swap(v: Any) -> Any:
        if isinstance(v, RoundedNumber):
            texts.append(v.text)
            return f"{mark}{len(texts) - 1}"
        if isinstance(v, dict):
            return {k: swap(x) for k, x in v.items()}
        if isinstance(v, list):
            return [swap(x) for x in v]
        return v

    out = json.dumps(swap(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return re.sub(f'"{re.escape(mark)}(\\d+)"', lambda m: texts[int(m.group(1))], out)


def parse_json_text(text: str, *, field: str) -> Any:
    """Parse JSON text, refusing NaN/Infinity and numbers beyond binary64 (1e400), marking
    the numbers parsing rounds (RoundedNumber), and reporting errors against `field`."""

    def _no_constant(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    try:
        return json.loads(text, parse_constant=_no_constant, parse_float=read_float)
    except (ValueError, TypeError, RecursionError) as exc:
        raise InvalidRequest(f"{field} is not valid JSON: {exc}", field=field) from None


@dataclass(frozen=True)
class OutputConstraint:
    """One content constraint. Build it with the class methods, not the constructor.

    `source` holds the GBNF text, the regex, or the canonical JSON text of a schema; `choices` holds
    the de-duplicated literals in first-seen order (order carries no meaning).
    """

    kind: ConstraintKind
    source: str = ""
    choices: tuple[str, ...] = ()
    whitespace: str | None = None  # JSON kinds: a JSON_WHITESPACE profile, None = model default

    @classmethod
    def grammar(cls, text: str) -> "OutputConstraint":
        if not isinstance(text, str):
            raise InvalidRequest("grammar must be a string of GBNF text", field="grammar")
        return cls(ConstraintKind.GRAMMAR, source=text)

    @classmethod
    def json_object(cls, *, whitespace: str | None = None) -> "OutputConstraint":
        return cls(ConstraintKind.JSON_OBJECT, whitespace=_whitespace(whitespace))

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | bool | str, *,
                    whitespace: str | None = None) -> "OutputConstraint":
        """`schema` is a parsed JSON value (object or boolean) or its JSON text; `whitespace` a
        JSON_WHITESPACE profile (InvalidRequest(field="whitespace") otherwise)."""
        if isinstance(schema, str):
            schema = parse_json_text(schema, field="json_schema")
        if not isinstance(schema, (dict, bool)):
            raise InvalidRequest(
                f"json_schema must be a JSON object or boolean, got {type(schema).__name__}",
                field="json_schema",
            )
        return cls(ConstraintKind.JSON_SCHEMA, source=canonical_json(schema),
                   whitespace=_whitespace(whitespace))

    @classmethod
    def choice(cls, options: Sequence[str]) -> "OutputConstraint":
        if isinstance(options, (str, bytes)) or not isinstance(options, Sequence):
            raise InvalidChoice("choice must be a list of strings")
        if len(options) == 0:
            raise InvalidChoice(
                "choice must hold at least one string; an empty list allows nothing"
            )
        seen: dict[str, None] = {}
        for i, option in enumerate(options):
            if not isinstance(option, str):
                raise InvalidChoice(
                    f"choice[{i}] must be a string, got {type(option).__name__}", index=i
                )
            seen.setdefault(option, None)
        return cls(ConstraintKind.CHOICE, choices=tuple(seen))

    @classmethod
    def regex(cls, pattern: str) -> "OutputConstraint":
        if not isinstance(pattern, str):
            raise InvalidRequest("regex must be a string", field="regex")
        return cls(ConstraintKind.REGEX, source=pattern)

    @property
    def schema(self) -> Any:
        """The parsed schema of a JSON_SCHEMA constraint."""
        assert self.kind is ConstraintKind.JSON_SCHEMA
        return json.loads(self.source, parse_float=read_float)

    def canonical_source(self) -> str:
        """The text the compile cache keys on: choices as their sorted de-duplicated set."""
        if self.kind is ConstraintKind.CHOICE:
            return canonical_json(sorted(self.choices))
        return self.source


@dataclass(frozen=True)
class ToolDefinition:
    """A function tool the caller declares: its argument schema and whether it is strict."""

    name: str
    parameters_json: str = '{"type":"object","properties":{}}'  # canonical JSON text
    description: str | None = None
    strict: bool = False

    @classmethod
    def create(
        cls,
        name: str,
        parameters: Mapping[str, Any] | None = None,
        *,
        description: str | None = None,
        strict: bool = False,
        index: int | None = None,
    ) -> "ToolDefinition":
        if not isinstance(name, str) or not name:
            raise InvalidToolDefinition(
                "tool name must be a non-empty string", tool_index=index, field="name"
            )
        if not all(c.isalnum() or c in "_-." for c in name) or len(name) > 128:
            raise InvalidToolDefinition(
                f"tool name {name!r} must be 1-128 characters of letters, digits, '_', '-' or '.'",
                tool_index=index,
                tool_name=name,
                field="name",
            )
        if parameters is None:
            parameters = {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise InvalidToolDefinition(
                "tool parameters must be a JSON Schema object",
                tool_index=index,
                tool_name=name,
                field="parameters",
            )
        if description is not None and not isinstance(description, str):
            raise InvalidToolDefinition(
                "tool description must be a string", tool_index=index, tool_name=name,
                field="description",
            )
        return cls(name, canonical_json(parameters), description, bool(strict))

    @property
    def parameters(self) -> Any:
        return json.loads(self.parameters_json, parse_float=read_float)


class ToolMode(str, Enum):
    AUTO = "auto"  # content, or zero or more calls
    NONE = "none"  # content only; declarations stay in the prompt
    REQUIRED = "required"  # at least one call, starting at once


class ToolConstraints(str, Enum):
    BASIC = "basic"  # framing and names constrained whenever tools are declared (default)
    AUTOMATIC = "automatic"  # only what the request asks for (strict, names, required, ...)


@dataclass(frozen=True)
class ToolChoice:
    """The call policy. OpenAI's named choice is REQUIRED with one allowed name and no parallel."""

    mode: ToolMode = ToolMode.AUTO
    allowed_names: tuple[str, ...] | None = None  # None: every declared tool
    parallel: bool = True  # False: at most one call this turn
    constraints: ToolConstraints = ToolConstraints.BASIC

    @classmethod
    def named(cls, name: str, *, parallel: bool = False) -> "ToolChoice":
        return cls(ToolMode.REQUIRED, (name,), parallel)


def validate_tools(tools: Sequence[ToolDefinition], choice: ToolChoice) -> None:
    """Reject duplicate tool names and allowed names that no tool declares."""
    names: dict[str, int] = {}
    for i, tool in enumerate(tools):
        if tool.name in names:
            raise InvalidToolDefinition(
                f"tool name {tool.name!r} is declared twice (tools[{names[tool.name]}] and "
                f"tools[{i}])",
                tool_index=i,
                tool_name=tool.name,
                field="name",
            )
        names[tool.name] = i
    for name in choice.allowed_names or ():
        if name not in names:
            raise InvalidRequest(
                f"tool_choice names {name!r}, which no declared tool has", field="tool_choice"
            )
    if choice.mode is ToolMode.REQUIRED and not tools:
        raise InvalidRequest("tool_choice requires a call but no tools are declared",
                             field="tool_choice")
