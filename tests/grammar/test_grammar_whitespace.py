"""The request-level JSON whitespace profiles (issue 11 section 3), on both engines.

Design document: "JSON uses the declared field order and admits insignificant whitespace between
tokens in runs of at most 32 characters" (`any`); the profiles `compact` (none) and `indented` (the
canonical 2-space layout, `json.dumps(value, indent=2)`) narrow that layout on request. The oracle
for the layouts is an independent re-layout of the output's own tokens (`relayout`), itself
checked against Python's `json.dumps`.
"""

from __future__ import annotations

import json
import random
import re

import pytest

from services.grammar.compiler import ModelCompiler, cache_key
from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema.emit import MAX_INDENT_DEPTH
from services.grammar.service import constraint_from_request, constraint_to_request
from services.grammar.tools.hermes import ToolSpec
from shared.contract import OutputConstraint, ToolChoice, ToolMode
from shared.errors import InvalidRequest
from tests.support.common import byte_domain

ENGINES = ("xgrammar", "llguidance")
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[-+0-9.eE]+|true|false|null|[{}\[\]:,]|\s+')

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 6},
    "tags": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9},
             "maxItems": 3},
    "meta": {"type": "object", "additionalProperties": {"type": "boolean"}},
    "kind": {"enum": [{"a": [1, {}]}, [], "x"]}},
    "required": ["name"], "additionalProperties": False}


def relayout(text: str, profile: str) -> str:
    """`text`'s JSON tokens (kept verbatim) in the profile's canonical layout."""
    tokens = [t for t in _TOKEN.findall(text) if not t.isspace()]
    if profile == "compact":
        return "".join(tokens)
    out, depth = [], 0
    for i, t in enumerate(tokens):
        nxt = tokens[i + 1] if i + 1 < len(tokens) else ""
        if t in "{[":
            depth += 1
            out.append(t if nxt in "}]" else t + "\n" + "  " * depth)
        elif t in "}]":
            depth -= 1
            prev = tokens[i - 1]
            out.append(t if prev in "{[" else "\n" + "  " * depth + t)
        elif t == ",":
            out.append(",\n" + "  " * depth)
        elif t == ":":
            out.append(": ")
        else:
            out.append(t)
    return "".join(out)


def test_relayout_matches_json_dumps():
    """The oracle itself: Python's own layouts."""
    for v in [{"a": [1, 2, {"b": None, "c": []}], "d": {}}, [], {}, [[1], {"x": "y,z"}], "s", 1]:
        one_line = json.dumps(v)
        assert relayout(one_line, "indented") == json.dumps(v, indent=2)
        assert relayout(one_line, "compact") == json.dumps(v, separators=(",", ":"))


def compile_ws(schema, profile, engine):
    return ModelCompiler(byte_domain()).compile(
        OutputConstraint.json_schema(schema, whitespace=profile), engine=engine).grammar


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("profile", ["compact", "indented"])
def test_walks_follow_the_canonical_layout(profile, engine):
    """Every completed walk is already in the profile's layout, so the layout is the only one."""
    g = compile_ws(SCHEMA, profile, engine)
    rng = random.Random(len(profile))
    done = 0
    for _ in range(30):
        walk = random_walk(g, byte_domain(), rng, max_tokens=80, end_bias=0.5)
        if walk.completed:
            done += 1
            text = walk.data.decode()
            json.loads(text)
            assert text == relayout(text, profile), text
    assert done >= 5


@pytest.mark.parametrize("engine", ENGINES)
def test_profiles_accept_exactly_their_layouts(engine):
    v = {"name": "ab", "tags": [1, 2], "meta": {"k": True}, "kind": {"a": [1, {}]}}
    layouts = {"compact": json.dumps(v, separators=(",", ":")),
               "indented": json.dumps(v, indent=2), "spaced": json.dumps(v)}
    for profile, ok in [("compact", {"compact"}), ("indented", {"indented"}),
                        ("any", {"compact", "indented", "spaced"})]:
        g = compile_ws(SCHEMA, profile, engine)
        for name, text in layouts.items():
            assert accepts(g, text) == (name in ok), (profile, name)
    empty = compile_ws({"type": "object"}, "indented", engine)
    assert accepts(empty, "{}") and not accepts(empty, "{\n}") and not accepts(empty, "{ }")


@pytest.mark.parametrize("engine", ENGINES)
def test_any_profile_bounds_runs_at_32(engine):
    """'runs of at most 32 characters', never around the root value."""
    g = compile_ws({"type": "object", "properties": {"a": {"type": "integer"}}}, "any", engine)
    for n in (0, 1, 32):
        assert accepts(g, "{" + " \n\t\r"[n % 4] * n + '"a":1}')
    assert not accepts(g, "{" + " " * 33 + '"a":1}')
    assert not accepts(g, ' {"a":1}') and not accepts(g, '{"a":1} ')


@pytest.mark.parametrize("engine", ENGINES)
def test_indentation_stops_at_the_depth_limit(engine):
    """Containers nested deeper than MAX_INDENT_DEPTH are written compact (documented limit)."""
    g = compile_ws({}, "indented", engine)
    deep = 0
    for _ in range(MAX_INDENT_DEPTH + 2):
        deep = [deep]
    text = json.dumps(deep, indent=2)
    inner = "[" * 2 + "0" + "]" * 2
    lines = json.dumps(deep, indent=2).split("\n")
    assert not accepts(g, text)
    compacted = "\n".join(lines[:MAX_INDENT_DEPTH]) + "\n" + "  " * MAX_INDENT_DEPTH + inner + \
        "\n" + "\n".join(lines[-MAX_INDENT_DEPTH:])
    assert json.loads(compacted) == deep
    assert accepts(g, compacted)


def test_profile_is_part_of_the_key_and_travels_everywhere():
    d = byte_domain()
    keys = {cache_key(OutputConstraint.json_schema(SCHEMA, whitespace=p), d)
            for p in ("any", "compact", "indented")}
    assert len(keys) == 3
    for p in ("compact", None):
        c = OutputConstraint.json_schema(SCHEMA, whitespace=p)
        assert constraint_from_request(constraint_to_request(c, model="m")) == c
        spec = ToolSpec((), ToolChoice(ToolMode.AUTO), OutputConstraint.json_object(whitespace=p))
        assert ToolSpec.from_json(spec.to_json()).content == spec.content
    with pytest.raises(InvalidRequest) as err:
        OutputConstraint.json_object(whitespace="pretty")
    assert err.value.field == "whitespace"


def test_gateway_reads_the_profile_from_structured_outputs():
    """The extension's `whitespace` option reaches the JSON content constraint of a chat request;
    a bad value or non-JSON content is a 400 naming `structured_outputs.whitespace`."""
    from services.gateway.limits import GatewayLimits
    from services.gateway.openai_chat import translate
    from shared.errors import ConflictingConstraint

    base = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_object"}}
    got = translate(
        {**base, "structured_outputs": {"whitespace": "indented"}}, "r", GatewayLimits()
    )
    assert got.request.options.constraint == OutputConstraint.json_object(whitespace="indented")
    assert translate(base, "r", GatewayLimits()).request.options.constraint.whitespace is None
    with pytest.raises(InvalidRequest) as err:
        translate({**base, "structured_outputs": {"whitespace": "tabs"}}, "r", GatewayLimits())
    assert err.value.field == "structured_outputs.whitespace"
    no_json = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
               "structured_outputs": {"regex": "a+", "whitespace": "compact"}}
    with pytest.raises(ConflictingConstraint) as err:
        translate(no_json, "r", GatewayLimits())
    assert err.value.field == "structured_outputs.whitespace"
