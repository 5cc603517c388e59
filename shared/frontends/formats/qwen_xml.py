"""The Qwen3.5 XML tool-call format: literals, the template's call text and value decoding.

One home for the grammar service's XML tool grammar (services/grammar/tools/xml_tools.py) and
the worker's output decoding (`qwen_xml_stream.ToolStream`). The canonical call, as the Qwen3.5 chat
template renders it and the constrained grammar generates it:

    <tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n...</function>\\n</tool_call>

`<tool_call>` and `</tool_call>` are control tokens: the grammar names them by id and the decoder
receives them as `Control` pieces (shared/frontends/pieces.py), so a `<tool_call>` spelled with
ordinary tokens is text. Further calls follow after one newline. A parameter value sits between
two framing newlines and ends at the first `\\n</parameter>` (`VALUE_END`), which the value never
contains; the delimiter has no border (no proper prefix is also a suffix), so the end is unique.

Value representation (design document): strict arguments write a pure string parameter as its raw
text and every other parameter as a JSON value; the decoder strips only the two framing newlines.
A non-strict value is free text; its JSON is chosen by the declared types (normalization hints,
`convert_value`), the way vLLM's qwen3_coder parser reads Qwen output.
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass, field
from typing import Any

FRAMING = "qwen-xml-v1"  # part of compiled tool grammars' cache identity
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"  # control tokens
FUNCTION_OPEN, FUNCTION_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
VALUE_END = "\n" + PARAM_CLOSE  # ends every value; never inside one
CALL_HEAD = "\n" + FUNCTION_OPEN  # after the opener token
CALL_TAIL = FUNCTION_CLOSE + "\n"  # before the closer token
CALL_SEPARATOR = "\n"  # between a closer token and the next opener token
JSON_TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")


def template_value(value: Any) -> str:
    """A value as the Qwen3.5 template writes it in history: strings raw, objects and arrays as
    JSON (`tojson`), other scalars as Jinja's `string` filter writes them (Python's str: True,
    None, 1.5)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return str(value)


def render_call(name: str, arguments_json: str) -> str:
    """The template's text of one call (opener and closer spelled): what history re-renders."""
    args = json.loads(arguments_json) if arguments_json else {}
    params = "".join(f"{PARAM_OPEN}{k}>\n{template_value(v)}{VALUE_END}\n" for k, v in args.items())
    return f"{CALL_OPEN}{CALL_HEAD}{name}>\n{params}{CALL_TAIL}{CALL_CLOSE}"


def representable_name(name: str) -> bool:
    """A parameter name the framing can carry: non-empty, without '>' or a line break."""
    return bool(name) and ">" not in name and "\n" not in name and "\r" not in name


@dataclass(frozen=True)
class ArgumentCoding:
    """How one tool's parameter values decode to JSON (the output value-decoding contract).

    Strict: `raw` names the pure string parameters (their text is the string); every other
    parameter's text is a JSON value, used verbatim. Non-strict: `types` holds the declared JSON
    types per name (normalization hints; a name without an entry has no declared type)."""

    strict: bool
    raw: frozenset[str] = frozenset()
    types: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def streams_as_string(self, name: str) -> bool:
        """The value's JSON is its text as a JSON string, known as the text arrives."""
        if self.strict:
            return name in self.raw
        declared = dict(self.types).get(name, ())
        return bool(declared) and set(declared) == {"string"}

    def verbatim(self, name: str) -> bool:
        """The value's text is its JSON (a strict non-string parameter)."""
        return self.strict and name not in self.raw

    def value_json(self, name: str, text: str) -> str:
        """The JSON text of a complete value."""
        if self.streams_as_string(name):
            return json.dumps(text, ensure_ascii=False)
        if self.verbatim(name):
            return text
        return json.dumps(convert_value(text, dict(self.types).get(name, ())), ensure_ascii=False)


def declared_types(schema: Any) -> tuple[str, ...]:
    """The JSON types a (non-strict) parameter schema declares, shallowly: `type`, else the types
    of `const` / `enum` values, else the union over `anyOf` / `oneOf` branches; () when none."""
    if not isinstance(schema, dict):
        return ()
    t = schema.get("type")
    if isinstance(t, str):
        return (t,) if t in JSON_TYPES else ()
    if isinstance(t, list):
        return tuple(x for x in t if x in JSON_TYPES)
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if isinstance(values, list) and values:
        return tuple(dict.fromkeys(_json_type(v) for v in values))
    out: list[str] = []
    for key in ("anyOf", "oneOf"):
        for branch in schema.get(key) or ():
            out.extend(declared_types(branch))
    return tuple(dict.fromkeys(out))


def hint_coding(parameters: Any) -> ArgumentCoding:
    """The non-strict coding of a tool's argument schema (declared types of its properties)."""
    props = parameters.get("properties") if isinstance(parameters, dict) else None
    types = tuple((k, declared_types(v)) for k, v in (props or {}).items() if declared_types(v))
    return ArgumentCoding(strict=False, types=types)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def _fits(value: Any, types: tuple[str, ...]) -> bool:
    if not types:
        return True
    kind = _json_type(value)
    return kind in types or (kind == "integer" and "number" in types)


_PYTHON_CONSTANTS = {"True": True, "False": False, "None": None}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def convert_value(text: str, types: tuple[str, ...]) -> Any:
    """A non-strict value's JSON value from its text and declared types (hints).

    A declared pure string keeps the text. Otherwise the first reading that fits the declared
    types (any, when none are declared) wins: JSON text; Python's True / False / None (the
    template writes scalars with Python's str); a Python literal of a list or object; and when
    nothing fits, the text as a string."""
    if types and set(types) <= {"string"}:
        return text
    try:
        value = json.loads(text, parse_constant=_no_constant)
        if _fits(value, types):
            return value
    except ValueError:
        pass
    stripped = text.strip()
    if stripped in _PYTHON_CONSTANTS and _fits(_PYTHON_CONSTANTS[stripped], types):
        return _PYTHON_CONSTANTS[stripped]
    if stripped[:1] in "[{":
        try:
            value = ast.literal_eval(stripped)
            json.dumps(value, allow_nan=False)  # only JSON-shaped literals
            if isinstance(value, (list, dict)) and _fits(value, types):
                return value
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            pass
    return text


@dataclass
class Call:
    """A call being read: its id, name and argument fragments (concatenated: arguments_json)."""

    id: str
    name: str = ""
    fragments: list[str] = field(default_factory=list)
    params: int = 0
