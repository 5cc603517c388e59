"""The Hermes tool contract: grammar (services/grammar/tools/hermes.py) and output decoder
(services/worker/tool_stream.py), checked with random legal walks and the jsonschema library.

Design document: "Auto allows zero or more calls; Required at least one; parallel=false limits it to
one." "Once in the call sequence only further calls and EOS are allowed, separated by single
newlines. Every strict tool's final arguments_json satisfies its argument schema." "the output
decoder reads constrained calls once as they are generated ... fragments that concatenate to the
call's final arguments_json". "When JSON output is also requested, Auto chooses between JSON content
and a tool sequence and does not mix them in one turn".
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.tools.hermes import CALL_OPEN, ToolSpec, needs_tool_grammar, tool_grammar_ebnf
from shared.contract import (
    OutputConstraint,
    ToolChoice,
    ToolConstraints,
    ToolDefinition,
    ToolMode,
)
from shared.errors import ConflictingConstraint, UnsupportedSchema
from shared.frontends.formats.hermes import ToolStream
from shared.generation import TextDelta, ToolCallArgumentsDelta, ToolCallStart
from tests.support.common import byte_domain

LOOKUP = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
TOOLS = (ToolDefinition.create("lookup", LOOKUP, strict=True),
         ToolDefinition.create("ping", {"type": "object", "properties": {"x": {"type": "number"}}}))


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _stream(text: str, rng: random.Random) -> tuple[ToolStream, list]:
    stream = ToolStream(constrained=True)
    events, i = [], 0
    while i < len(text):
        n = rng.randint(1, 7)
        events += stream.feed(text[i:i + n])
        i += n
    events += stream.finish(complete=True)
    return stream, events


@pytest.mark.parametrize("choice", [
    ToolChoice(), ToolChoice(ToolMode.REQUIRED), ToolChoice.named("lookup"),
    ToolChoice(parallel=False), ToolChoice(ToolMode.REQUIRED, allowed_names=("ping",)),
], ids=["auto", "required", "named", "auto-single", "required-ping"])
def test_walks_obey_policy_and_decode_to_valid_calls(choice: ToolChoice, compiler) -> None:
    grammar = compiler.compile_grammar(tool_grammar_ebnf(ToolSpec(TOOLS, choice)))
    rng = random.Random(7)
    completed = 0
    for _ in range(40):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=300, end_bias=0.35)
        if not walk.completed:
            continue
        completed += 1
        stream, events = _stream(walk.data.decode("utf-8"), rng)
        calls = stream.tool_calls()
        assert CALL_OPEN not in stream.text()
        if choice.mode is ToolMode.REQUIRED:
            assert calls and stream.text() == ""
        if not choice.parallel:
            assert len(calls) <= 1
        allowed = choice.allowed_names or ("lookup", "ping")
        for index, call in enumerate(calls):
            assert call.name in allowed
            fragments = [e.fragment for e in events
                         if isinstance(e, ToolCallArgumentsDelta) and e.index == index]
            assert "".join(fragments) == call.arguments_json
            args = json.loads(call.arguments_json)
            schema = LOOKUP if call.name == "lookup" else {"type": "object"}
            jsonschema.validate(args, schema)
        starts = [e for e in events if isinstance(e, ToolCallStart)]
        assert [s.name for s in starts] == [c.name for c in calls]
        assert "".join(e.text for e in events if isinstance(e, TextDelta)) == stream.text()
    assert completed >= 5


def test_strict_arguments_reject_what_the_schema_rejects(compiler) -> None:
    grammar = compiler.compile_grammar(tool_grammar_ebnf(ToolSpec(TOOLS, ToolChoice())))
    call = '<tool_call>\n{{"name": "lookup", "arguments": {args}}}\n</tool_call>'
    assert accepts(grammar, "Let me check. " + call.format(args='{"city": "Paris", "days": 3}'))
    assert not accepts(grammar, call.format(args='{"city": "Paris", "days": 30}'))
    assert not accepts(grammar, call.format(args='{"city": "Paris"}'))
    assert not accepts(grammar, call.format(args='{"days": 3, "city": "Paris", "x": 1}'))
    assert not accepts(grammar, call.format(args='{}').replace("lookup", "unknown"))
    assert not accepts(grammar, "text " + CALL_OPEN + " more text")
    two = (
        call.format(args='{"city": "A", "days": 1}')
        + "\n"
        + call.format(args='{"city": "B", "days": 2}')
    )
    assert accepts(grammar, two)
    assert not accepts(grammar, two + "\ntrailing text")


def test_json_union_is_content_or_calls_never_both(compiler) -> None:
    spec = ToolSpec(TOOLS, ToolChoice(), OutputConstraint.json_schema(
        {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
         "additionalProperties": False}))
    grammar = compiler.compile_grammar(tool_grammar_ebnf(spec))
    call = '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>'
    assert accepts(grammar, '{"answer": "yes"}')
    assert accepts(grammar, call)
    assert not accepts(grammar, '{"answer": "yes"}' + call)
    assert not accepts(grammar, "free text")


def test_policy_choices() -> None:
    """Basic constrains whenever tools are active; Automatic only when the request asks; none and
    no tools build no tool grammar; GBNF/choice/regex conflict with active tools."""
    assert needs_tool_grammar(TOOLS, ToolChoice(), None)
    assert not needs_tool_grammar(TOOLS, ToolChoice(ToolMode.NONE), None)
    assert not needs_tool_grammar((), ToolChoice(), None)
    loose = (ToolDefinition.create("ping"),)
    assert not needs_tool_grammar(loose, ToolChoice(constraints=ToolConstraints.AUTOMATIC), None)
    assert needs_tool_grammar(loose, ToolChoice(ToolMode.REQUIRED,
                                                constraints=ToolConstraints.AUTOMATIC), None)
    with pytest.raises(ConflictingConstraint):
        needs_tool_grammar(TOOLS, ToolChoice(), OutputConstraint.regex("a+"))
    assert not needs_tool_grammar(TOOLS, ToolChoice(ToolMode.NONE), OutputConstraint.regex("a+"))


def test_strict_tool_with_open_object_is_rejected_with_its_index() -> None:
    tools = (TOOLS[1], ToolDefinition.create("open", {"type": "object"}, strict=True))
    with pytest.raises(UnsupportedSchema) as err:
        tool_grammar_ebnf(ToolSpec(tools, ToolChoice()))
    assert err.value.tool_index == 1 and err.value.tool_name == "open"
    assert err.value.source.value == "tool_arguments"


def test_truncated_call_is_dropped_and_completed_calls_kept() -> None:
    call = '<tool_call>\n{"name": "ping", "arguments": {"x": 1}}\n</tool_call>'
    stream = ToolStream(constrained=True)
    stream.feed(call + "\n" + call[:30])
    stream.finish(complete=False)
    assert [c.arguments_json for c in stream.tool_calls()] == ['{"x": 1}']


@pytest.mark.parametrize("cut", [3, len("<tool_call>\n{\"na")], ids=["opener", "head"])
def test_output_cut_inside_a_call_opener_keeps_the_calls_before_it(cut: int) -> None:
    """Issue 12 load test: a tool-call output truncated (max_tokens) inside the next call's
    opener, before its name, ended with IndexError (no entry for the unfinished call to drop),
    which then took the worker's engine thread down; the completed calls stay, none is invented."""
    call = '<tool_call>\n{"name": "ping", "arguments": {"x": 1}}\n</tool_call>'
    for before in ("", call + "\n"):
        stream = ToolStream(constrained=True)
        stream.feed(before + call[:cut])
        stream.finish(complete=False)
        assert [c.arguments_json for c in stream.tool_calls()] == (['{"x": 1}'] if before else [])


def test_free_route_reads_calls_at_the_end_and_keeps_bad_text_as_content() -> None:
    stream = ToolStream(constrained=False)
    events = stream.feed("Sure. ")
    events += stream.feed('<tool_call>\n{"name": "ping", "arguments": {"x": 2}}\n</tool_call>')
    events += stream.feed("\n<tool_call>\nnot json\n</tool_call>")
    events += stream.finish(complete=True)
    assert [c.name for c in stream.tool_calls()] == ["ping"]
    assert json.loads(stream.tool_calls()[0].arguments_json) == {"x": 2}
    assert "not json" in stream.text() and stream.text().startswith("Sure. ")


def test_tool_spec_travels_and_caches_like_a_content_constraint() -> None:
    """A tool grammar shares the compile cache and the gRPC Compile request: its key depends on the
    tool framing, allowed names and strict schemas, and the spec survives the wire unchanged."""
    import asyncio

    from services.grammar.cache.grammar_cache import GrammarCache
    from services.grammar.compiler import ModelCompiler
    from services.grammar.service import constraint_from_request, constraint_to_request
    from services.grammar.tools.hermes import FRAMING

    spec = ToolSpec(TOOLS, ToolChoice.named("lookup"))
    wire = constraint_to_request(spec, model="smollm2")
    assert wire.kind == "tools" and wire.framing == FRAMING
    back = constraint_from_request(wire)
    assert back.canonical_source() == spec.canonical_source()

    async def run() -> None:
        cache = GrammarCache(ModelCompiler(byte_domain()))
        first = await cache.compile(spec)
        second = await cache.compile(back)
        other = await cache.compile(ToolSpec(TOOLS, ToolChoice()))
        assert first.stats.built and second.stats.hit == "l1" and first.key == second.key
        assert other.key != first.key
        assert accepts(first.grammar,
                       '<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo", "days": 2}}'
                       '\n</tool_call>')
        assert not accepts(first.grammar,
                           '<tool_call>\n{"name": "ping", "arguments": {}}\n</tool_call>')

    asyncio.run(run())


WEATHER_LOOSE = {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"]}


def _call(name: str, args: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>'


@pytest.mark.parametrize("choice", [ToolChoice(ToolMode.REQUIRED), ToolChoice.named("weather")],
                         ids=["required", "named"])
def test_forced_calls_follow_a_non_strict_schema(choice: ToolChoice, compiler) -> None:
    """A forced call is constrained by its schema whether or not `strict` is set (the strict flag
    decides only what is rejected when the schema cannot be enforced exactly); a tool with no
    parameters gets `{}`."""
    tools = (ToolDefinition.create("weather", WEATHER_LOOSE), ToolDefinition.create("ping"))
    grammar = compiler.compile_grammar(tool_grammar_ebnf(ToolSpec(tools, choice)))
    assert accepts(grammar, _call("weather", '{"city": "Oslo", "unit": "celsius"}'))
    assert accepts(grammar, _call("weather", '{"city": "Oslo"}'))
    assert not accepts(grammar, _call("weather", '{"unit": "celsius"}'))  # required city
    assert not accepts(grammar, _call("weather", '{"city": "Oslo", "unit": "kelvin"}'))
    # the root is closed to its declared properties: the call must end
    assert not accepts(grammar, _call("weather", '{"city": "Oslo", "note": "x"}'))
    if choice.allowed_names is None:
        assert accepts(grammar, _call("ping", "{}"))
        assert not accepts(grammar, _call("ping", '{"x": 1}'))
    # auto leaves a non-strict tool's arguments free (any JSON object), as before
    free = compiler.compile_grammar(tool_grammar_ebnf(ToolSpec(tools, ToolChoice())))
    assert accepts(free, _call("weather", '{"unit": "kelvin", "note": [1]}'))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": True},
    {"type": "array", "items": {"type": "integer"}},
], ids=["open-object", "not-an-object"])
def test_forced_non_strict_schema_that_cannot_be_enforced_falls_back_to_any_object(
        schema, compiler) -> None:
    """What cannot be enforced exactly is refused only for a strict tool; a non-strict forced
    call still gets a call, with any JSON object as its arguments."""
    loose = (ToolDefinition.create("t", schema),)
    grammar = compiler.compile_grammar(tool_grammar_ebnf(ToolSpec(loose, ToolChoice.named("t"))))
    assert accepts(grammar, _call("t", '{"a": "x", "b": [true]}'))
    assert not accepts(grammar, "free text")
    with pytest.raises(UnsupportedSchema):
        tool_grammar_ebnf(ToolSpec((ToolDefinition.create("t", schema, strict=True),),
                                   ToolChoice.named("t")))


def test_forced_non_strict_schemas_are_part_of_the_cache_identity() -> None:
    """The grammar of a forced call depends on a non-strict tool's schema, so its key does; an
    auto choice's grammar does not, nor its key."""
    a = (ToolDefinition.create("t", WEATHER_LOOSE),)
    b = (ToolDefinition.create("t", {"type": "object", "properties": {"x": {"type": "number"}}}),)
    forced = ToolChoice.named("t")
    assert ToolSpec(a, forced).canonical_source() != ToolSpec(b, forced).canonical_source()
    assert ToolSpec(a, ToolChoice()).canonical_source() == \
        ToolSpec(b, ToolChoice()).canonical_source()
    back = ToolSpec.from_json(ToolSpec(a, forced).to_json())
    assert back.canonical_source() == ToolSpec(a, forced).canonical_source()
