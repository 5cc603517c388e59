"""The Qwen3.5 XML tool grammar (services/grammar/tools/xml_tools.py) under every output framing,
judged by an independent reader of the format (tests/support/xml_walks.py), jsonschema, and the
production decoder (shared/frontends/formats/qwen_xml_stream.py) reading the same walks.

Design document: "Strict arguments use explicit physical framing ... The two \\n are the framing
newlines. Decoding strips only that pair"; "The non-strict base argument language allows any order
and any representable argument name"; "A call names each argument once"; "the output decoder reads
constrained calls once as they are generated (ConstrainedToolStream) and publishes each call's
arguments JSON in fragments (ToolCallDelta) that concatenate to the call's final arguments_json";
"Auto allows zero or more calls; Required at least one; parallel=false limits it to one";
"When JSON output is also requested, Auto chooses between JSON content and a tool sequence and does
not mix them in one turn"; "The tool grammars open every call with the model's <tool_call> token".
"""

from __future__ import annotations

import json
import random

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.engines.matching import legal_ids
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.xml_tools import argument_codings
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.frontends.formats.qwen_xml_stream import ToolStream
from shared.frontends.thinking import CONTENT, QWEN_THINK, REASONING, PhaseDecoder, ThinkingFraming
from shared.generation import ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from tests.support.qwen_support import xml_domain
from tests.support.xml_walks import decode_arguments, parse, walk

LOOKUP = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "days": {"type": "integer", "minimum": 1, "maximum": 9},
    "units": {"enum": ["metric", "imperial"]},
    "code": {"type": "string", "pattern": "^[A-Z]{2}[0-9]?$"},
    "note": {"type": "string"},
    "tags": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
    "required": ["city", "days"], "additionalProperties": False}
STAMP = {"type": "object", "properties": {"at": {"type": "number"}, "label": {"type": "string",
                                                                              "minLength": 1}},
         "required": ["label"], "additionalProperties": False}
STRICT = (ToolDefinition.create("lookup", LOOKUP, strict=True),
          ToolDefinition.create("stamp", STAMP, strict=True))
LOOSE = (
    ToolDefinition.create(
        "ping", {"type": "object", "properties": {"x": {"type": "number"}, "s": {"type": "string"}}}
    ),
    ToolDefinition.create("echo", None),
)
ANSWER = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
SCHEMAS = {"lookup": LOOKUP, "stamp": STAMP}


@pytest.fixture(scope="module")
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(xml_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def _framing(thinking: bool, inner: str) -> str:
    return f"qwen-think-v1+{inner}" if thinking else inner


def _thinking_framing() -> ThinkingFraming:
    d = xml_domain()
    close = d.special_id("</think>")
    return ThinkingFraming(QWEN_THINK, d.special_id("<think>"), close, (10, close, 10, 10),
                           (close, 10, 10))


def decode(tokens: list[int], tools, *, thinking: bool):
    """The production decoder: phase decoder, then the XML tool stream."""
    d = xml_domain()
    dec = PhaseDecoder(d, _thinking_framing(), phase=REASONING if thinking else CONTENT,
                       call_open_id=d.special_id("<tool_call>"))
    stream = ToolStream(constrained=True, codings=argument_codings(tools))
    events, reasoning = [], []
    for item in dec.feed(tokens) + dec.finish():
        if isinstance(item, ReasoningDelta):
            reasoning.append(item.text)
        else:
            events += stream.feed(item)
    events += stream.finish(complete=True)
    return stream, events, "".join(reasoning)


def _prefer():
    d = xml_domain()
    return frozenset(d.control_ids - {d.special_id("<think>"), d.special_id("<|im_start|>")}) | \
        frozenset(range(256, 256 + 17))


def _check_calls(parsed, stream, events, tools) -> None:
    calls = stream.tool_calls()
    assert [c.name for c in calls] == [name for name, _ in parsed.calls]
    by_name = {t.name: t for t in tools}
    for index, (call, (name, params)) in enumerate(zip(calls, parsed.calls)):
        fragments = [e.fragment for e in events
                     if isinstance(e, ToolCallArgumentsDelta) and e.index == index]
        assert "".join(fragments) == call.arguments_json
        starts = [e for e in events if isinstance(e, ToolCallStart) and e.index == index]
        assert [s.name for s in starts] == [name]
        args = json.loads(call.arguments_json)
        names = [p for p, _ in params]
        assert len(names) == len(set(names)), f"a name repeats in {names}"
        tool = by_name[name]
        if tool.strict:
            schema = SCHEMAS[name]
            assert args == decode_arguments(params, schema)
            jsonschema.validate(args, schema)
            declared = list(schema["properties"])
            assert names == sorted(names, key=declared.index)  # declared order
        else:
            assert list(args) == names


@pytest.mark.parametrize("thinking", [False, True], ids=["think-off", "think-on"])
@pytest.mark.parametrize("kind", ["content", "tools", "json|tools"])
@pytest.mark.parametrize("strict", [True, False], ids=["strict", "non-strict"])
def test_walks_of_every_framing_read_back(thinking, kind, strict, compiler) -> None:
    """Every completed random walk is in the format (independent reader), its JSON content is
    valid, its strict arguments validate and keep declared order, its non-strict names are unique
    (the companion applied to every mask), and the production decoder reads the same calls with
    fragments that concatenate to the final arguments."""
    if kind == "content" and not strict:
        pytest.skip("a content constraint has no tools")
    d = xml_domain()
    tools = STRICT if strict else LOOSE
    if kind == "content":
        constraint = OutputConstraint.json_schema(ANSWER)
        framing = _framing(thinking, "raw")
    else:
        content = OutputConstraint.json_schema(ANSWER) if kind == "json|tools" else None
        constraint = ToolSpec(tools, ToolChoice(), content)
        framing = _framing(thinking, "qwen-xml-v1")
    compiled = compiler.compile_grammar(build_framed_grammar(constraint, framing, d))
    rng = random.Random(11)
    seen_calls = completed = 0
    for _ in range(20):
        w = walk(compiled, d, rng, names=not strict, prefer=_prefer(), max_tokens=300,
                 end_bias=0.12)
        if not w.completed:
            continue
        completed += 1
        parsed = parse(w.tokens, d, thinking=thinking)
        stream, events, reasoning = decode(w.tokens, tools, thinking=thinking)
        if thinking:
            raw = parsed.reasoning.decode("utf-8", "replace")
            assert reasoning == (raw[:-1] if raw.endswith("\n") else raw)
        if kind != "tools" and not parsed.calls:
            jsonschema.validate(json.loads(parsed.content), ANSWER)
        if kind == "json|tools" and parsed.calls:
            assert parsed.content == ""
        text = "".join(e.text for e in events if isinstance(e, TextDelta))
        assert text == stream.text()
        if kind != "content":
            assert parsed.content.startswith(stream.text())
            assert len(parsed.content) - len(stream.text()) <= (2 if parsed.calls else 0)
            _check_calls(parsed, stream, events, tools)
        seen_calls += len(parsed.calls)
    assert completed >= 5
    if kind != "content":
        assert seen_calls >= (2 if kind == "json|tools" else 3)


@pytest.mark.parametrize("choice", [
    ToolChoice(), ToolChoice(ToolMode.REQUIRED), ToolChoice.named("stamp"),
    ToolChoice(parallel=False), ToolChoice(ToolMode.NONE)],
    ids=["auto", "required", "named", "auto-single", "none"])
def test_call_policy(choice, compiler) -> None:
    """Required starts with a call; named allows one name once; parallel=false at most one call;
    none never makes the opener legal; a call opens only with the opener token."""
    d = xml_domain()
    compiled = compiler.compile_grammar(build_framed_grammar(
        ToolSpec(STRICT + LOOSE, choice), "qwen-xml-v1", d))
    opener = d.special_id("<tool_call>")
    rng = random.Random(5)
    for _ in range(15):
        w = walk(compiled, d, rng, names=True, prefer=_prefer(), max_tokens=250, end_bias=0.15)
        if choice.mode is ToolMode.NONE:
            assert opener not in w.tokens
        if not w.completed:
            continue
        parsed = parse(w.tokens, d, thinking=False)
        names = [name for name, _ in parsed.calls]
        if choice.mode is ToolMode.REQUIRED:
            assert names and w.tokens[0] == opener and parsed.content == ""
        if not choice.parallel:
            assert len(names) <= 1
        if choice.allowed_names:
            assert set(names) <= set(choice.allowed_names)
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, d.size)
    matcher.fill_next_token_bitmask(mask)
    legal = set(legal_ids(mask[0], d.size))
    assert (opener in legal) == (choice.mode is not ToolMode.NONE)
    assert not (legal & (d.control_ids - {opener}))  # no other control token opens anything


def test_spelled_opener_is_text(compiler) -> None:
    """`<tool_call>` spelled with ordinary tokens is free text: the output may end after it, and
    the decoder reads it as content."""
    d = xml_domain()
    compiled = compiler.compile_grammar(build_framed_grammar(ToolSpec(STRICT, ToolChoice()),
                                                             "qwen-xml-v1", d))
    text = b"<tool_call>\n<function=stamp>\n<parameter=label>\nx\n</parameter>\n</function>\n"
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    assert all(matcher.accept_token(b) for b in text) and matcher.is_completed()
    stream, events, _ = decode(list(text), STRICT, thinking=False)
    assert stream.tool_calls() == () and stream.text() == text.decode().rstrip("\n") + "\n"


def _accepts(compiled, tokens) -> bool:
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_completed()


def _call_tokens(name: str, body: str) -> list[int]:
    d = xml_domain()
    return [d.special_id("<tool_call>")] + list(f"\n<function={name}>\n{body}</function>\n"
                                                .encode()) + [d.special_id("</tool_call>")]


@pytest.mark.parametrize("body,ok", [
    ("<parameter=label>\n  spaced\nlines \n</parameter>\n", True),
    ("<parameter=at>\n1.5\n</parameter>\n<parameter=label>\nx\n</parameter>\n", True),
    ("<parameter=label>\nx\n</parameter>\n<parameter=at>\n1.5\n</parameter>\n", False),  # order
    ("<parameter=at>\n1.5\n</parameter>\n", False),  # required label missing
    ("<parameter=label>\n\n</parameter>\n", False),  # minLength 1
    ("<parameter=label>\n\"x\"\n</parameter>\n", True),  # raw: the quotes are the value
    ("<parameter=at>\nNaN\n</parameter>\n<parameter=label>\nx\n</parameter>\n", False),
    ("<parameter=label>\nx\n</parameter>\n<parameter=label>\ny\n</parameter>\n", False),
    ("<parameter=label>\na\n</parameter>\n</parameter>\n", False),
])
def test_strict_language(body, ok, compiler) -> None:
    """Strict arguments: declared order, required present, raw strings with their assertions,
    JSON values for other types, the framing exactly."""
    d = xml_domain()
    compiled = compiler.compile_grammar(build_framed_grammar(
        ToolSpec(STRICT, ToolChoice(ToolMode.REQUIRED)), "qwen-xml-v1", d))
    assert _accepts(compiled, _call_tokens("stamp", body)) == ok


def test_none_is_a_grammar_only_where_the_opener_is_a_token() -> None:
    """`none` forbids generating the opener: with a control-token opener (XML) that takes a
    grammar of free text (unless a content constraint owns the output); Hermes stays free."""
    from services.grammar.tools.hermes import needs_tool_grammar

    none = ToolChoice(ToolMode.NONE)
    assert needs_tool_grammar(LOOSE, none, None, opener_is_token=True)
    assert not needs_tool_grammar(LOOSE, none, OutputConstraint.json_object(),
                                  opener_is_token=True)
    assert not needs_tool_grammar(LOOSE, none, None)
    assert not needs_tool_grammar((), none, None, opener_is_token=True)


@pytest.mark.asyncio
async def test_framings_compile_through_the_cache_under_their_own_keys() -> None:
    """The framing is part of the cache identity; a framing that does not fit the source is a
    typed error naming the field."""
    from services.grammar.cache.grammar_cache import GrammarCache
    from services.grammar.compiler import ModelCompiler
    from shared.errors import Unsupported

    cache = GrammarCache(ModelCompiler(xml_domain()))
    spec = ToolSpec(STRICT, ToolChoice())
    keys = {f: (await cache.compile(spec, framing=f)).key
            for f in ("qwen-xml-v1", "qwen-think-v1+qwen-xml-v1", "hermes-v1")}
    assert len(set(keys.values())) == 3
    content = OutputConstraint.json_schema(ANSWER)
    assert (await cache.compile(content, framing="qwen-think-v1+raw")).key != \
        (await cache.compile(content)).key
    for source, framing in ((spec, "raw"), (content, "qwen-xml-v1"), (content, "nope+raw")):
        with pytest.raises(Unsupported) as err:
            await cache.compile(source, framing=framing)
        assert err.value.field == "framing"


def test_forced_calls_follow_a_non_strict_schema_in_xml(compiler) -> None:
    """A forced call is constrained by its schema whether or not `strict` is set, in the XML
    format too (declared order, required present, the root closed to its declared parameters),
    and the decoder's coding follows the same classification (a string parameter is raw text);
    a schema the XML format cannot enforce exactly falls back to the loose arguments for a
    non-strict tool and stays refused for a strict one."""
    from shared.errors import UnsupportedSchema

    note = {"type": "object", "properties": {"text": {"type": "string"},
                                             "n": {"type": "integer"}}, "required": ["text"]}
    tools = (ToolDefinition.create("note", note),)
    d = xml_domain()
    forced = compiler.compile_grammar(build_framed_grammar(
        ToolSpec(tools, ToolChoice.named("note")), "qwen-xml-v1", d))
    good = "<parameter=text>\nhi\n</parameter>\n<parameter=n>\n2\n</parameter>\n"
    assert _accepts(forced, _call_tokens("note", good))
    for bad in ("<parameter=n>\n2\n</parameter>\n",  # text is required
                "<parameter=n>\n2\n</parameter>\n<parameter=text>\nhi\n</parameter>\n",  # order
                "<parameter=text>\nhi\n</parameter>\n<parameter=x>\n1\n</parameter>\n",
                "<parameter=text>\nhi\n</parameter>\n<parameter=n>\nmany\n</parameter>\n"):
        assert not _accepts(forced, _call_tokens("note", bad)), bad
    coding = argument_codings(tools, forced=True)["note"]
    assert coding.strict and coding.raw == frozenset({"text"})
    assert not argument_codings(tools)["note"].strict  # auto: the loose coding, as before
    auto = compiler.compile_grammar(build_framed_grammar(ToolSpec(tools, ToolChoice()),
                                                         "qwen-xml-v1", d))
    loose_call = "<parameter=x>\n1\n</parameter>\n"
    assert _accepts(auto, _call_tokens("note", loose_call))
    mixed = {"type": "object", "properties": {"v": {"type": ["string", "integer"]}}}
    fallback = compiler.compile_grammar(build_framed_grammar(
        ToolSpec((ToolDefinition.create("m", mixed),), ToolChoice.named("m")), "qwen-xml-v1", d))
    assert _accepts(fallback, _call_tokens("m", loose_call))
    assert not argument_codings((ToolDefinition.create("m", mixed),), forced=True)["m"].strict
    with pytest.raises(UnsupportedSchema):
        build_framed_grammar(ToolSpec((ToolDefinition.create("m", mixed, strict=True),),
                                      ToolChoice.named("m")), "qwen-xml-v1", d)
