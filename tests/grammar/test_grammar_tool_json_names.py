"""The JSON name companion on tool-call arguments: Hermes calls' arguments and the JSON-valued
parameters of Qwen XML calls (services/grammar/json_spans.py frames, json_names.py companion).

Rule (the seed's JSON contract, shared by response schemas and strict tool arguments): "No
generated object may repeat a name." The companion reads only the JSON spans of a tool output:
the arguments inside the Hermes envelope and the JSON values between `<parameter=K>\\n` and
`\\n</parameter>`, never the envelope's own keys, the free text before calls or the reasoning, and
each call's arguments have object scopes of their own. Expected answers come from `jsonschema`
and Python's json parser (names reported by `object_pairs_hook`); masks are checked against a
brute-force search through the grammar."""

from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids
from services.grammar.json_names import tool_json_names_for
from services.grammar.json_text import WAIT
from services.grammar.tools.hermes import ToolSpec, tool_grammar_ebnf
from services.grammar.tools.xml_tools import xml_tool_grammar_ebnf
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition, ToolMode
from shared.errors import UnsupportedSchema
from tests.grammar.test_grammar_json_names import (
    EXACT_SCHEMAS,
    ISSUE_CASES,
    ORACLE_BYTES,
    WALK_BYTES,
    _has_repeat,
)
from tests.support.common import byte_domain
from tests.support.qwen_support import xml_domain

HERMES_HEAD = b'<tool_call>\n{"name": "f", "arguments": '
HERMES_TAIL = b"}\n</tool_call>"
XML_HEAD = b"\n<function=f>\n<parameter=v>\n"
XML_TAIL = b"\n</parameter>\n</function>\n"


def _strict(schema: object) -> ToolDefinition:
    """A strict tool whose one required parameter `v` follows `schema` (tool roots are closed
    objects, so the content cases sit one level down)."""
    return ToolDefinition.create("f", {"type": "object", "properties": {"v": schema},
                                       "required": ["v"], "additionalProperties": False},
                                 strict=True)


def _spec(tool: ToolDefinition, mode=ToolMode.REQUIRED, parallel=False,
          content: OutputConstraint | None = None) -> ToolSpec:
    return ToolSpec((tool,), ToolChoice(mode, None, parallel), content)


class Session:
    """A matcher over a small byte vocabulary with the companion, as the worker pairs them."""

    def __init__(self, spec: ToolSpec, framing: str, domain) -> None:
        self.domain = domain
        self.matcher = ModelCompiler(domain).compile(spec, framing).grammar.matcher()
        self.names = tool_json_names_for(spec, domain, framing)
        assert self.names is not None
        self.tokens: list[int] = []

    def mask(self) -> tuple[set[int], set[int]]:
        """(the grammar's legal ids, those the companion keeps)."""
        row = np.zeros((1, self.domain.mask_words), dtype=np.int32)
        self.matcher.fill_mask(row, 0)
        allowed = set(legal_ids(row[0], self.domain.size))
        self.names.apply(row[0], self.matcher)
        return allowed, set(legal_ids(row[0], self.domain.size))

    def accept(self, t: int) -> None:
        assert self.matcher.accept_token(t), self.domain.token_bytes[t]
        self.names.accept(t)
        self.tokens.append(t)

    def feed(self, parts) -> bool:
        """Accept `parts` (bytes, one token per byte, or a control token name) while every token
        stays in the companion's mask; False at the first it clears (nothing accepted after)."""
        for part in parts:
            ids = [self.domain.special_id(part)] if isinstance(part, str) else list(part)
            for t in ids:
                if t not in self.mask()[1]:
                    return False
                self.accept(t)
        return True


def _hermes_call(args: str) -> list:
    return [HERMES_HEAD + args.encode() + HERMES_TAIL]


def _xml_call(value: str) -> list:
    return ["<tool_call>", XML_HEAD + value.encode() + XML_TAIL, "</tool_call>"]


def _expected(schema: object, text: str) -> bool:
    return not _has_repeat(text.encode()) and \
        jsonschema.Draft202012Validator(schema).is_valid(json.loads(text))


@pytest.mark.parametrize("framing", ["hermes-v1", "qwen-xml-v1"])
@pytest.mark.parametrize("case", range(len(ISSUE_CASES)))
def test_content_cases_as_tool_arguments(case, framing):
    """Every duplicate-name case of content JSON, as a strict tool's argument (Hermes arguments,
    an XML JSON-valued parameter): the tool grammar compiles it (the count refusal is lifted
    under the companion) and, with the companion, accepts exactly the instances `jsonschema`
    accepts and whose names are unique."""
    schema, instances = ISSUE_CASES[case]
    if framing != "hermes-v1" and "type" not in schema and "allOf" not in schema:
        schema = {**schema, "type": "object"}  # an XML value that may be a string is raw text
    spec = _spec(_strict(schema))
    domain = byte_domain() if framing == "hermes-v1" else xml_domain()
    for text in instances:
        session = Session(spec, framing, domain)
        parts = _hermes_call('{"v": ' + text + "}") if framing == "hermes-v1" \
            else _xml_call(text)
        ok = session.feed(parts) and session.matcher.is_completed()
        assert ok is _expected(schema, text), (schema, text)


def test_non_strict_arguments_repeat_no_name_and_calls_have_their_own_scopes():
    """A non-strict tool's arguments are any JSON object: a repeat is refused at every depth
    (names unescaped), while the next call, a nested object and the envelope's keys are scopes
    of their own; the free text before the first call is not read."""
    tool = ToolDefinition.create("f", None)
    spec = _spec(tool, ToolMode.AUTO, parallel=True)
    d = byte_domain()
    good = [b'{"a":1,"a":2} free text ', HERMES_HEAD,
            b'{"a": {"a": 1}, "name": 2, "b": [{"a": 3}]}',
            HERMES_TAIL, b"\n", HERMES_HEAD, b'{"a": 1, "arguments": 2}', HERMES_TAIL]
    session = Session(spec, "hermes-v1", d)
    assert session.feed(good) and session.matcher.is_completed()
    for bad in ('{"a": 1, "a": 2}', '{"a": 1, "\\u0061": 2}', '{"x": {"b": 1, "b": 2}}'):
        session = Session(spec, "hermes-v1", d)
        assert not session.feed([b"hi ", HERMES_HEAD, bad.encode(), HERMES_TAIL]), bad


def test_the_reader_waits_outside_the_argument_spans():
    """Envelope, free text and XML framing are outside every span: the JSON reader waits there,
    and each span starts with no name used."""
    d = byte_domain()
    session = Session(_spec(ToolDefinition.create("f", None), ToolMode.AUTO), "hermes-v1", d)
    for b in b'{"a":1,' + HERMES_HEAD[:-2]:
        session.accept(b)
        assert session.names.state[0] == WAIT
    for b in HERMES_HEAD[-2:] + b'{"a":1,':
        session.accept(b)
    assert session.names.state[3] == (frozenset({b"a"}),)
    x = xml_domain()
    tool = _strict({"type": "object"})
    tool = ToolDefinition.create("f", {"type": "object", "properties": {
        "s": {"type": "string"}, "v": {"type": "object"}}, "additionalProperties": False},
        strict=True)
    session = Session(_spec(tool), "qwen-xml-v1", x)
    assert session.feed(["<tool_call>", b'\n<function=f>\n<parameter=s>\n{"a":1,"a":2}'
                                        b"\n</parameter>\n<parameter=v>\n"])
    assert session.names.state[3] == ()
    assert session.feed([b'{"a":1,'])
    assert session.names.state[3] == (frozenset({b"a"}),)
    assert not session.feed([b'"a"'])


def test_union_content_is_read_and_calls_are_not_confused_with_it():
    """JSON content OR calls (auto with a JSON content constraint): the content is one span to
    the end; a call's arguments are spans of their own."""
    d = byte_domain()
    spec = _spec(ToolDefinition.create("f", None), ToolMode.AUTO,
                 content=OutputConstraint.json_object())
    session = Session(spec, "hermes-v1", d)
    assert not session.feed([b'{"a": 1, "a"'])
    session = Session(spec, "hermes-v1", d)
    assert session.feed([b'{"a": 1, "b": {"a": 2}}']) and session.matcher.is_completed()
    session = Session(spec, "hermes-v1", d)
    assert session.feed(_hermes_call('{"a": 1}')) and session.matcher.is_completed()


def test_finite_name_counts_stay_refused_and_free_counts_compile():
    """'A minimum count that undeclared names restricted by patternProperties or propertyNames
    would have to fill beyond one member stays refused at its pointer' (a finite set can run out
    below the minimum); a count of any-string names compiles for tool arguments now that the
    companion runs beside every tool grammar."""
    d = xml_domain()
    free = _strict({"type": "object", "minProperties": 2})
    for build in (lambda s: tool_grammar_ebnf(s), lambda s: xml_tool_grammar_ebnf(s, d)):
        build(_spec(free))
        finite = _strict({"type": "object", "propertyNames": {"enum": ["a", "b"]},
                          "minProperties": 3})
        with pytest.raises(UnsupportedSchema) as err:
            build(_spec(finite))
        assert err.value.pointer == "/properties/v/minProperties"


def test_no_companion_without_free_names():
    """Closed arguments and raw-string XML parameters get no companion (no cost)."""
    closed = _strict({"type": "integer"})
    assert tool_json_names_for(_spec(closed), byte_domain(), "hermes-v1") is None
    raw = _strict({"type": "string"})
    assert tool_json_names_for(_spec(raw), xml_domain(), "qwen-xml-v1") is None
    loose = ToolDefinition.create("f", None)
    assert tool_json_names_for(_spec(loose, ToolMode.AUTO), xml_domain(), "qwen-xml-v1") is None
    assert tool_json_names_for(_spec(loose, ToolMode.AUTO), byte_domain(), "hermes-v1") \
        is not None


# ---------------------------------------------------------------- mask exactness



def _ends(session: Session, text: bytearray, tail: list) -> bool:
    """The rest of the call's fixed `tail` (bytes, then control token names) is accepted after
    `text`, which may already hold the start of its first part, the output may end there, and
    the span's text repeats no name (the matcher is left as it was)."""
    first, *rest = tail
    for k in range(len(first)):
        if text.endswith(first[:k]) and _accepts_then_ends(session, [first[k:], *rest]):
            try:
                if not _has_repeat(bytes(text[:len(text) - k])):
                    return True
            except ValueError:
                pass
    return False


def _accepts_then_ends(session: Session, tail: list) -> bool:
    m = session.matcher
    n = 0
    try:
        for part in tail:
            ids = [session.domain.special_id(part)] if isinstance(part, str) else list(part)
            for t in ids:
                if not m.accept_token(t):
                    return False
                n += 1
        return m.is_completed()
    finally:
        m.rollback(n)


def _completes(session: Session, text: bytearray, depth: int, tail: list) -> bool:
    """Brute force: some completion of the span over ORACLE_BYTES (at most `depth` bytes) after
    which the rest of the call's fixed `tail` is accepted and the output may end, with unique
    names."""
    if _ends(session, text, tail):
        return True
    if depth == 0:
        return False
    m = session.matcher
    for b in ORACLE_BYTES:
        if m.accept_token(b):
            text.append(b)
            try:
                if _completes(session, text, depth - 1, tail):
                    return True
            finally:
                text.pop()
                m.rollback(1)
    return False


@pytest.mark.parametrize("framing", ["hermes-v1", "qwen-xml-v1"])
@pytest.mark.parametrize("schema", EXACT_SCHEMAS, ids=range(len(EXACT_SCHEMAS)))
def test_mask_is_exact_against_brute_force(schema, framing):
    """'The mask exact at every position': along random walks inside a tool argument, a token
    survives the companion exactly when the brute-force search finds a complete call after it
    whose arguments repeat no name; the grammar alone allows some repeats."""
    hermes = framing == "hermes-v1"
    domain = byte_domain() if hermes else xml_domain()
    spec = _spec(_strict(schema))
    rng = random.Random(7)
    cleared = 0
    for _ in range(3):
        session = Session(spec, framing, domain)
        head = [HERMES_HEAD + b'{"v": '] if hermes else ["<tool_call>", XML_HEAD]
        tail = [HERMES_TAIL] if hermes else [XML_TAIL, "</tool_call>"]
        assert session.feed(head)
        text = bytearray(b'{"v": ' if hermes else b"")  # the span's text so far
        for _ in range(12):
            if session.names.state[0] == WAIT:  # the walk left the span
                break
            allowed, kept = session.mask()
            cleared += len(allowed - kept)
            for t in sorted(allowed):
                if t in domain.eos_ids or not domain.is_ordinary(t):
                    continue
                assert session.matcher.accept_token(t)
                text += domain.token_bytes[t]
                good = _completes(session, text, 8 if hermes else 7, tail)
                del text[-len(domain.token_bytes[t]):]
                session.matcher.rollback(1)
                assert (t in kept) is good, (schema, bytes(text), domain.token_bytes[t])
            choices = sorted(t for t in kept if t < 256 and t in WALK_BYTES)
            if not choices:
                break
            t = rng.choice(choices)
            session.accept(t)
            text.append(t)
    if schema.get("type") == "object":
        assert cleared > 0  # the walks met repeats the grammar alone allowed


def test_after_thinking_the_calls_start_at_the_close_or_at_an_xml_opener():
    """Design: reasoning, then the close token and the tool language; an XML opener inside the
    reasoning opens a call at once (the grammar's implicit end of reasoning). Reasoning text is
    never read as arguments."""
    from services.grammar.json_spans import HermesFrame, XmlFrame
    from services.grammar.json_text import START, WAITING

    hermes = HermesFrame(start=99)
    state = hermes.feed(hermes.initial, HERMES_HEAD + b'{"a":1,')
    assert state[1] == WAITING  # still reasoning
    state = hermes.feed(hermes.token(state, 99), b"\n\n" + HERMES_HEAD + b'{"a":1,')
    assert state[1][3] == (frozenset({b"a"}),)
    xml = XmlFrame({b"f": frozenset({b"v"})}, 7, 8, start=99)
    state = xml.feed(xml.token(xml.initial, 7), XML_HEAD)
    assert state[1] == START


def test_a_repeated_mask_is_answered_from_the_probe_cache():
    """Probe answers are kept by the grammar state they were asked in: the same mask again (the
    lookahead's K+1 masks, a proposer's probe then the verification) runs no new search and
    clears the same tokens."""
    d = byte_domain()
    spec = _spec(_strict({"type": "object", "propertyNames": {"enum": ["ab", "b"]},
                          "additionalProperties": {"const": 1}}))
    session = Session(spec, "hermes-v1", d)
    assert session.feed([HERMES_HEAD + b'{"v": {"ab":1,"b":1'])
    first = session.mask()
    probes = session.names.probes
    assert probes > 0 and first[0] != first[1]
    assert session.mask() == first and session.names.probes == probes
