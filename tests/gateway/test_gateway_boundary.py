"""The body boundary (issue 11 §1): lone surrogates, nesting depth and strict JSON, over raw HTTP
against a real gateway (what a JavaScript client sends), and `json_depth` against a recursive
reference."""

from __future__ import annotations

import json

import aiohttp
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from services.gateway import GatewayLimits
from services.gateway.body import json_depth
from tests.support.fake_worker import FakeWorker, running_gateway

aio = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
S = "\ud800"  # a lone high surrogate: a JavaScript string cut inside an emoji
SCHEMA = {"type": "object", "properties": {"a": {"type": "string", "enum": ["x", "y"]}}}


def chat(**extra) -> dict:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **extra}


def messages(**extra) -> dict:
    return {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}],
            **extra}


def responses(**extra) -> dict:
    return {"model": MODEL, "input": "hi", **extra}


def fn_tool(**function) -> dict:
    return {"type": "function", "function": {"name": "f", **function}}


# (route, body, the field the 400 names)
SURROGATE_CASES = [
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": f"a{S}b"}]),
     "messages[0].content"),
    ("/v1/chat/completions", chat(messages=[{"role": "system", "content": S},
                                            {"role": "user", "content": "x"}]),
     "messages[0].content"),
    ("/v1/chat/completions", chat(messages=[{"role": "user", "content": [
        {"type": "text", "text": "ok"}, {"type": "text", "text": S}]}]),
     "messages[0].content[1].text"),
    ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "string", "enum": ["ok", S]}}}),
     "response_format.json_schema.schema.enum[1]"),
    ("/v1/chat/completions", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "s", "schema": {"type": "object", "properties": {S: {"type": "string"}}}}}),
     'response_format.json_schema.schema.properties."\\ud800"'),
    ("/v1/chat/completions", chat(structured_outputs={"regex": f"[a{S}]+"}),
     "structured_outputs.regex"),
    ("/v1/chat/completions", chat(structured_outputs={"grammar": f'root ::= "{S}"'}),
     "structured_outputs.grammar"),
    ("/v1/chat/completions", chat(structured_outputs={"choice": ["yes", S]}),
     "structured_outputs.choice[1]"),
    ("/v1/chat/completions", chat(tools=[fn_tool(description=S)]), "tools[0].function.description"),
    ("/v1/chat/completions", chat(tools=[fn_tool(parameters={
        "type": "object", "properties": {"q": {"type": "string", "description": S}}})]),
     "tools[0].function.parameters.properties.q.description"),
    ("/v1/chat/completions", chat(stop=["ok", S]), "stop[1]"),
    ("/v1/completions", {"model": MODEL, "prompt": S}, "prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", S]}, "prompt[1]"),
    ("/v1/responses", responses(instructions=S), "instructions"),
    ("/v1/responses", responses(input=[{"role": "user", "content": [
        {"type": "input_text", "text": S}]}]), "input[0].content[0].text"),
    ("/v1/responses", responses(text={"format": {"type": "json_schema", "name": "s", "schema": {
        "type": "object", "properties": {"a": {"type": "string", "pattern": S}}}}}),
     "text.format.schema.properties.a.pattern"),
    ("/v1/responses", responses(tools=[{"type": "function", "name": "f", "description": S}]),
     "tools[0].description"),
    ("/v1/messages", messages(system=S), "system"),
    ("/v1/messages", messages(system=[{"type": "text", "text": S}]), "system[0].text"),
    ("/v1/messages", messages(messages=[{"role": "user", "content": [
        {"type": "text", "text": S}]}]), "messages[0].content[0].text"),
    ("/v1/messages", messages(tools=[{"name": "f", "input_schema": {
        "type": "object", "properties": {"q": {"enum": [S]}}}}]),
     "tools[0].input_schema.properties.q.enum[0]"),
    ("/v1/messages", messages(output_config={"format": {"type": "json_schema", "schema": {
        "type": "object", "title": S}}}), "output_config.format.schema.title"),
    ("/v1/messages", messages(stop_sequences=[S]), "stop_sequences[0]"),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": S}]},
     "messages[0].content"),
]


def raw_json(body: dict) -> bytes:
    """The body as a JavaScript client sends it: surrogates as \\uXXXX escapes."""
    return json.dumps(body, ensure_ascii=True).encode()


def error_of(route: str, payload: dict) -> dict:
    return payload["error"]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker()
    async with running_gateway(worker, limits=GatewayLimits(max_json_depth=64)) as url:
        async with aiohttp.ClientSession() as http:
            yield worker, url, http


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served[0].reset()
    return served


async def post(http: aiohttp.ClientSession, url: str, data: bytes) -> tuple[int, dict]:
    async with http.post(url, data=data, headers={"Content-Type": "application/json"}) as r:
        return r.status, await r.json()


@aio
@pytest.mark.parametrize("route, body, field", SURROGATE_CASES,
                         ids=[f"{c[0]}:{c[2]}" for c in SURROGATE_CASES])
async def test_lone_surrogate_is_a_400_naming_its_field(gw, route, body, field):
    """Issue 11 §1: "A lone surrogate ... anywhere in a body" never gives a 500: the rule (one
    place, the body boundary) is a 400 naming the field, in every field, constraints included."""
    worker, url, http = gw
    status, payload = await post(http, url + route, raw_json(body))
    assert status == 400, payload
    error = error_of(route, payload)
    assert error["param"] == field
    assert "surrogate" in error["message"]
    assert worker.requests == []


@aio
async def test_surrogate_pairs_are_characters(gw):
    """A high-low pair is one character (an emoji), not an error: it reaches the worker whole."""
    worker, url, http = gw
    body = chat(messages=[{"role": "user", "content": "smile \ud83d\ude00"}])
    status, _ = await post(http, url + "/v1/chat/completions", raw_json(body))
    assert status == 200
    assert worker.last.prompt.messages[0].content == "smile \U0001F600"


@aio
@pytest.mark.parametrize("route, make", [
    ("/v1/chat/completions", lambda deep: chat(metadata={"k": "v"}, user=deep)),
    ("/v1/chat/completions", lambda deep: chat(response_format={
        "type": "json_schema", "json_schema": {"name": "s", "schema": deep}})),
    ("/v1/completions", lambda deep: {"model": MODEL, "prompt": deep}),
    ("/v1/responses", lambda deep: responses(input=deep)),
    ("/v1/messages", lambda deep: messages(tools=[{"name": "f", "input_schema": deep}])),
])
async def test_deep_nesting_is_a_typed_400(gw, route, make):
    """Issue 11 §1: "JSON nested 100,000 deep in any field gives a 500 ...; a schema nested 5,000
    levels too. Bound nesting depth at the boundary with a typed 400": the limit is named and no
    recursive parser ever sees the body; a normal request is served afterwards."""
    worker, url, http = gw
    marker = '"__deep__"'
    arrays = "[" * 100_000 + "]" * 100_000
    schema = '{"properties":{"a":' * 5_000 + "{}" + "}}" * 5_000
    for deep in (arrays, schema):
        text = json.dumps(make("__deep__")).replace(marker, deep)
        status, payload = await post(http, url + route, text.encode())
        assert status == 400, payload
        assert "max_json_depth=64" in payload["error"]["message"]
    assert worker.requests == []
    status, _ = await post(http, url + "/v1/chat/completions", raw_json(chat()))
    assert status == 200


def depth(value) -> int:
    """Independent reference: the nesting depth of a parsed JSON value, recursively."""
    if isinstance(value, dict):
        return 1 + max((depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth(v) for v in value), default=0)
    return 0


@aio
async def test_depth_limit_is_exact(gw):
    """A body at exactly max_json_depth passes the boundary; one level more does not."""
    worker, url, http = gw
    for levels, expected in ((64, 200), (65, 400)):
        nested: object = "x"
        for _ in range(levels - 2):
            nested = [nested]
        body = chat(metadata={"k": nested})
        assert depth(body) == levels
        status, payload = await post(http, url + "/v1/chat/completions", raw_json(body))
        assert status == expected, payload


@aio
@pytest.mark.parametrize("data, code", [
    (b'{"model": "smollm2", "messages": [], "temperature": NaN}', "invalid_json"),
    (b'{"model": "smollm2", "temperature": Infinity}', "invalid_json"),
    (b'{"model": "smollm2", "temperature": 1e999}', "invalid_json"),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "\xff"}]}', "invalid_json"),
    (b'\xef\xbb\xbf{"model": "smollm2"}', "invalid_json"),
    (b'[1, 2]', "invalid_json"),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "seed": '
     + str(2**64).encode() + b"}", "invalid_request"),
    (b'{"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "temperature": '
     + b"9" * 400 + b"}", "invalid_request"),
])
async def test_malformed_json_is_a_400(gw, data, code):
    """Strict JSON at the boundary: NaN, infinities, numbers a double cannot hold, bytes that
    are not UTF-8, and integers beyond int64 (what the worker contract carries) are 400s."""
    worker, url, http = gw
    status, payload = await post(http, url + "/v1/chat/completions", data)
    assert status == 400, payload
    assert payload["error"]["code"] == code


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ab\n\u00e9'),
    lambda children: st.lists(children, max_size=4) |
    st.dictionaries(st.text(alphabet='[]{}"\\k', max_size=3), children, max_size=4),
    max_leaves=30)


@settings(max_examples=300, deadline=None, database=None)
@given(json_values)
def test_json_depth_matches_a_recursive_reference(value):
    """`json_depth` reads nesting from raw bytes (strings cut out, then a running sum): it agrees
    with a recursive walk of the parsed value, brackets, quotes and escapes inside strings
    included."""
    for text in (json.dumps(value), json.dumps(value, ensure_ascii=False, indent=1)):
        assert json_depth(text.encode()) == depth(value)


@aio
@pytest.mark.parametrize("route, make, field", [
    ("/v1/chat/completions", lambda src: chat(structured_outputs={"regex": src("regex")}),
     "structured_outputs.regex"),
    ("/v1/chat/completions", lambda src: chat(structured_outputs={"grammar": src("grammar")}),
     "structured_outputs.grammar"),
    ("/v1/responses", lambda src: responses(text={"format": {
        "type": "json_schema", "name": "s", "schema": {"type": "string",
                                                        "pattern": src("regex")}}}),
     "text.format.schema"),
    ("/v1/messages", lambda src: messages(tools=[{"name": "f", "strict": True, "input_schema": {
        "type": "object", "patternProperties": {src("regex"): {}}}}]), "tools[0].input_schema"),
])
async def test_deeply_nested_constraint_sources_are_a_typed_400(gw, route, make, field):
    """The regex and GBNF parsers behind the gateway recurse per group level (a regex of 250
    nested groups overflowed Python's stack, a 500): group nesting is bounded at the boundary
    (`max_constraint_nesting`), inside schema patterns too; sources within it pass."""
    worker, url, http = gw

    def nested(levels: int):
        return lambda kind: ("(" * levels + "a" + ")" * levels if kind == "regex" else
                             "root ::= " + "(" * levels + '"a"' + ")" * levels)

    status, payload = await post(http, url + route, raw_json(make(nested(250))))
    assert status == 400, payload
    assert payload["error"]["param"] == field
    assert "max_constraint_nesting=64" in payload["error"]["message"]
    assert worker.requests == []
    status, payload = await post(http, url + route, raw_json(make(nested(64))))
    assert status == 200, payload


# (regex atom, GBNF atom): parentheses that are escaped, in classes or in literals don't nest.
_atoms = st.sampled_from([("a", '"a"'), ("\\(", '"("'), ("\\)", '")"'), ("[()]", "[()]"),
                          ("[\\]()]", "[\\]()]"), ("x*", '"x"*'), ("\\\\", '"\\\\"'),
                          ("b", '"\\"("')])


@st.composite
def sources_with_depth(draw, max_depth: int = 6) -> tuple[str, str, int]:
    """A regex and a GBNF body built as one tree, so their group depth is known by construction."""
    if max_depth == 0 or draw(st.booleans()):
        regex, gbnf = draw(_atoms)
        return regex, gbnf, 0
    parts = [draw(sources_with_depth(max_depth - 1)) for _ in range(draw(st.integers(1, 3)))]
    opener = draw(st.sampled_from(["(", "(?:", "(?<n>"]))
    return (opener + "".join(p[0] for p in parts) + ")",
            "(" + " ".join(p[1] for p in parts) + ")", 1 + max(p[2] for p in parts))


@settings(max_examples=150, deadline=None, database=None)
@given(st.lists(sources_with_depth(max_depth=5), min_size=1, max_size=3))
def test_group_depth_matches_the_construction(parts):
    """`group_depth` (escapes, classes, literals and comments cut out, then a running sum)
    equals the depth the source was built with."""
    from services.gateway.body import group_depth

    depth = max(p[2] for p in parts)
    assert group_depth("|".join(p[0] for p in parts), "regex") == depth
    grammar = "root ::= " + " | ".join(p[1] for p in parts) + "  # ((( a comment\n"
    assert group_depth(grammar, "grammar") == depth
