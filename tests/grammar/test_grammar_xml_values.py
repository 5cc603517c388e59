"""Strict XML argument values (services/grammar/tools/xml_values.py): raw strings with their
assertions and the delimiter exclusion, and the schemas the XML format cannot represent, rejected
while preparing with a typed error naming the parameter.

Design document: "A raw string argument ends at \\n</parameter>, which must not occur in the
value ... A string's pattern/length and the delimiter exclusion hold together"; "A raw argument
mixing string with other types whose branch the model format cannot determine is rejected for
strict composition while preparing"; "If a required const value contains the raw argument
terminator, which cannot be represented, preparation returns unsupported"; "it requires
additionalProperties=false".
"""

from __future__ import annotations

import pytest
import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.xml_tools import argument_codings
from shared.contract import ToolChoice, ToolDefinition, ToolMode
from shared.errors import SchemaSource, UnsupportedSchema
from tests.support.qwen_support import xml_domain

DELIM = "\n</parameter>"


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xml_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _tool(prop: dict, *, required: bool = True) -> ToolDefinition:
    return ToolDefinition.create("f", {"type": "object", "properties": {"v": prop},
                                       "required": ["v"] if required else [],
                                       "additionalProperties": False}, strict=True)


def _compiled(compiler, tool: ToolDefinition):
    spec = ToolSpec((tool,), ToolChoice(ToolMode.REQUIRED))
    return compiler.compile_grammar(build_framed_grammar(spec, "qwen-xml-v1", xml_domain()))


def _accepts_value(compiled, value: str) -> bool:
    d = xml_domain()
    tokens = [d.special_id("<tool_call>")] + list(
        f"\n<function=f>\n<parameter=v>\n{value}\n</parameter>\n</function>\n".encode()) + \
        [d.special_id("</tool_call>")]
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_completed()


def _by_independent_rule(value: str, lo: int, hi: int | None) -> bool:
    return DELIM not in value and lo <= len(value) and (hi is None or len(value) <= hi)


VALUES = ["", "a", "abc", " x ", "\n", "é日本", "ab\n</parameter>cd", "\n</parameter",
          "</parameter>", "x" * 12, "x" * 13, "y" * 20, "y" * 21, "a\n\n</parameter>\nb",
          "\n</parameter>", "q" * 40]


@pytest.mark.parametrize("lo,hi", [(0, None), (0, 12), (3, None), (4, None), (2, 5)])
def test_raw_string_lengths_and_delimiter(lo, hi, compiler) -> None:
    """A raw string value is accepted exactly when it has no delimiter and its length (Unicode
    characters) is within the bounds: the automaton with and without a count."""
    prop = {"type": "string", "minLength": lo}
    if hi is not None:
        prop["maxLength"] = hi
    compiled = _compiled(compiler, _tool(prop))
    for value in VALUES:
        assert _accepts_value(compiled, value) == _by_independent_rule(value, lo, hi), value


def test_raw_enum_and_anchored_pattern(compiler) -> None:
    """String enums are their raw texts; an anchored pattern without line breaks is its own
    language (search semantics inside the anchors)."""
    compiled = _compiled(compiler, _tool({"enum": ["a b", "", "c\nd"]}))
    assert [v for v in ["a b", "", "c\nd", "a", '"a b"'] if _accepts_value(compiled, v)] == \
        ["a b", "", "c\nd"]
    compiled = _compiled(compiler, _tool({"type": "string", "pattern": "^[A-Z]{2}[0-9]?$"}))
    assert [v for v in ["AB", "AB1", "A", "ab", "AB12", "AB\n"] if _accepts_value(compiled, v)] \
        == ["AB", "AB1"]


def test_a_pattern_with_a_length_bound_is_their_intersection(compiler) -> None:
    """The schema reduction intersects a pattern with its length bounds into one automaton
    (services/grammar/schema/automata.py), so such a raw string value is representable."""
    compiled = _compiled(compiler, _tool({"type": "string", "pattern": "^a+$", "maxLength": 3}))
    assert [v for v in ["a", "aa", "aaa", "aaaa", "", "b"] if _accepts_value(compiled, v)] \
        == ["a", "aa", "aaa"]


def test_json_values_for_other_types(compiler) -> None:
    """A parameter without strings in its type is a JSON value of its schema (never Python's
    True/None, never a raw string)."""
    compiled = _compiled(compiler, _tool({"type": ["integer", "null", "boolean"]}))
    assert [v for v in ["1", "-3", "null", "true", "True", "None", '"1"', "1.5"]
            if _accepts_value(compiled, v)] == ["1", "-3", "null", "true"]


@pytest.mark.parametrize("prop,fragment", [
    ({"type": ["string", "null"]}, "mixes string"),
    ({}, "mixes string"),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, "mixes string"),
    ({"enum": ["a", 1]}, "mixes string"),
    ({"const": "x\n</parameter>y"}, "delimiter"),
    ({"enum": ["ok", "bad\n</parameter>"]}, "delimiter"),
    ({"type": "string", "pattern": "[0-9]+"}, "line break"),
    ({"anyOf": [{"type": "string", "maxLength": 13},
                {"type": "string", "minLength": 20, "maxLength": 30}]}, "gap"),
])
def test_unrepresentable_parameters_are_typed_errors(prop, fragment, compiler) -> None:
    """Rejected while preparing, with the tool's index and name and the parameter's pointer; the
    decoder's contract refuses the same schema."""
    tool = _tool(prop)
    for build in (lambda: _compiled(compiler, tool), lambda: argument_codings((tool,))):
        with pytest.raises(UnsupportedSchema) as err:
            build()
        e = err.value
        assert fragment in e.message and e.source is SchemaSource.TOOL_ARGUMENTS
        assert e.tool_index == 0 and e.tool_name == "f" and e.pointer.startswith("/properties/v")


def test_names_and_closed_root(compiler) -> None:
    """A property name the framing cannot carry, and a strict root that is not closed, are
    rejected; the codings name the raw string parameters."""
    bad = ToolDefinition.create("f", {"type": "object", "properties": {"a>b": {"type": "string"}},
                                      "additionalProperties": False}, strict=True)
    with pytest.raises(UnsupportedSchema, match="cannot be written"):
        _compiled(compiler, bad)
    open_root = ToolDefinition.create("f", {"type": "object", "properties": {}}, strict=True)
    with pytest.raises(UnsupportedSchema, match="additionalProperties"):
        _compiled(compiler, open_root)
    tool = ToolDefinition.create("f", {"type": "object", "properties": {
        "s": {"type": "string"}, "e": {"enum": ["x"]}, "n": {"type": "number"},
        "r": {"$ref": "#/$defs/S"}}, "$defs": {"S": {"type": "string"}},
        "additionalProperties": False}, strict=True)
    assert argument_codings((tool,))["f"].raw == {"s", "e", "r"}
