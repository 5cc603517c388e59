"""The Qwen3.5 output decoders without a grammar: the phase decoder's rules on free output, the
XML tool stream's constrained and free routes, and continuation prefixes as tokens.

Design document: "</think> spelled with ordinary tokens is reasoning in both"; "A line break
directly before the close token is framing too ... and is not published as reasoning"; "content
bytes after the separator publish as generated"; "On the constrained route, a call the grammar
confirmed complete but the parser cannot read under the same contract is an implementation
inconsistency, never masked by falling back to content. The free route keeps its existing
handling of malformed text"; "on truncation completed calls and the actual stop reason are kept,
and an unfinished call produces no arguments_json"; "A tool grammar is token-level in its free
text and call openers, so the Frontend gives it the prefix as tokens: each <tool_call> the client
spelled as the <tool_call> token ... every other byte as its byte-level token"; "a raw assistant
prefix containing completed calls is rejected".
"""

from __future__ import annotations

import json
import random

import pytest

from shared.errors import InternalError, InvalidRequest
from shared.frontends import get_frontend
from shared.frontends.formats.qwen_xml import (
    ArgumentCoding,
    convert_value,
    hint_coding,
    render_call,
)
from shared.frontends.formats.qwen_xml_stream import ToolStream
from shared.frontends.pieces import Control
from shared.frontends.thinking import CONTENT, REASONING
from shared.generation import ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart

OPEN, CLOSE = Control(248058, "<tool_call>"), Control(248059, "</tool_call>")
CODINGS = {"lookup": ArgumentCoding(strict=True, raw=frozenset({"city"})),
           "ping": hint_coding({"type": "object", "properties": {"n": {"type": "integer"},
                                                                  "s": {"type": "string"}}})}


@pytest.fixture(scope="module")
def frontend():
    return get_frontend("qwen3.5")


def _ordinary(text: str) -> list[int]:
    from shared.frontends.qwen35 import qwen35_tokenizer

    return qwen35_tokenizer()._tokenizer.encode_ordinary(text)


def _run(frontend, tokens, phase=REASONING):
    dec = frontend.phase_decoder(phase)
    items = dec.feed(tokens) + dec.finish()
    reasoning = "".join(i.text for i in items if isinstance(i, ReasoningDelta))
    content = [i for i in items if not isinstance(i, ReasoningDelta)]
    return reasoning, content, dec


def test_phase_decoder_rules(frontend) -> None:
    """Spelled `</think>` stays reasoning, the line break before the close token is framing, the
    separator is consumed exactly, the content keeps its leading whitespace, EOS is never text,
    a multi-byte character split across tokens is held until complete."""
    t = frontend.thinking
    eos = min(frontend.domain.eos_ids)
    text = "Plan: write </think> as text.\nDone"
    tokens = _ordinary(text + "\n") + [t.close_id] + _ordinary("\n\n  é\n") + [eos]
    reasoning, content, dec = _run(frontend, tokens)
    assert reasoning == text and "".join(content) == "  é\n" and dec.phase == CONTENT
    split = list("é".encode())  # two byte-level tokens, one character
    by_byte = frontend.domain.byte_token_ids
    reasoning, content, _ = _run(frontend, [by_byte[split[0]]])
    assert reasoning == "\ufffd"  # an unfinished character at the end: U+FFFD
    r, _, _ = _run(frontend, [by_byte[b] for b in split])
    assert r == "é"


def test_free_output_without_the_separator(frontend) -> None:
    """Free output may close without the separator or emit other control tokens: the decoder
    still splits at the close token and publishes what follows as content."""
    t = frontend.thinking
    reasoning, content, _ = _run(frontend, _ordinary("x") + [t.close_id] + _ordinary("\nHi"))
    assert reasoning == "x" and "".join(content) == "Hi"
    im_start = frontend.domain.special_id("<|im_start|>")
    reasoning, content, _ = _run(frontend, [im_start, t.close_id, 248058])
    assert reasoning == "<|im_start|>" and content == [Control(248058, "<tool_call>")]


@pytest.mark.parametrize("tail,expected_lead", [("abc", True), ("abc\n", False)])
def test_forced_close_sequence(tail, expected_lead, frontend) -> None:
    """The forced close is `\\n</think>\\n\\n` as the tokenizer writes it, without the line break
    when the reasoning already ends with one; outside reasoning nothing is forced."""
    t = frontend.thinking
    _, _, dec = _run(frontend, _ordinary(tail))
    dec2 = frontend.phase_decoder(REASONING)
    dec2.feed(_ordinary(tail))
    close = dec2.forced_close()
    assert close == (t.close_tokens if expected_lead else t.close_tokens_after_newline)
    assert frontend.tokenizer.encode(("\n" if expected_lead else "") + "</think>\n\n") == list(
        close
    )
    dec2.feed(close)
    assert dec2.phase == CONTENT and dec2.forced_close() == ()


def _feed_all(stream, pieces, rng):
    events = []
    for piece in pieces:
        if isinstance(piece, str):
            i = 0
            while i < len(piece):
                n = rng.randint(1, 5)
                events += stream.feed(piece[i:i + n])
                i += n
        else:
            events += stream.feed(piece)
    return events


def _call_pieces(name, args_text):
    return [OPEN, f"\n<function={name}>\n{args_text}</function>\n", CLOSE]


def test_constrained_stream_fragments_and_values() -> None:
    """Fragments concatenate to the final arguments: a raw string as its JSON string (the two
    framing newlines stripped, its own whitespace and a spelled delimiter prefix kept), a strict
    JSON value verbatim, a non-strict value by its declared types; content before the call
    streams, the framing line breaks before the call do not."""
    city = "  New\n</param York \n"
    pieces = ["Checking", "\n\n"] + _call_pieces(
        "lookup", f"<parameter=city>\n{city}\n</parameter>\n<parameter=days>\n"
                  "[1, {\"a\": null}]\n</parameter>\n") + ["\n"] + _call_pieces(
        "ping", "<parameter=n>\n42\n</parameter>\n<parameter=s>\nx\n</parameter>\n"
                "<parameter=z>\nTrue\n</parameter>\n") + ["\n"] + _call_pieces("ping", "")
    for seed in range(5):
        stream = ToolStream(constrained=True, codings=CODINGS)
        events = _feed_all(stream, pieces, random.Random(seed)) + stream.finish(complete=True)
        calls = stream.tool_calls()
        assert [json.loads(c.arguments_json) for c in calls] == [
            {"city": city, "days": [1, {"a": None}]}, {"n": 42, "s": "x", "z": True}, {}]
        for i, call in enumerate(calls):
            assert "".join(e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta)
                           and e.index == i) == call.arguments_json
        assert [e.name for e in events if isinstance(e, ToolCallStart)] == ["lookup", "ping",
                                                                            "ping"]
        assert stream.text() == "Checking" == "".join(e.text for e in events
                                                      if isinstance(e, TextDelta))


def test_constrained_truncation_and_inconsistency() -> None:
    """A truncated output keeps completed calls and drops the unfinished one; a normal end inside
    a call, or text that breaks the framing, is an internal error, never content."""
    stream = ToolStream(constrained=True, codings=CODINGS)
    for p in _call_pieces("ping", "") + ["\n", OPEN, "\n<function=lookup>\n<parameter=ci"]:
        stream.feed(p)
    stream.finish(complete=False)
    assert [c.name for c in stream.tool_calls()] == ["ping"]
    stream = ToolStream(constrained=True, codings=CODINGS)
    stream.feed(OPEN)
    with pytest.raises(InternalError):
        stream.feed("\n<func=x>")
    stream = ToolStream(constrained=True, codings=CODINGS)
    for p in [OPEN, "\n<function=ping>\n"]:
        stream.feed(p)
    with pytest.raises(InternalError):
        stream.finish(complete=True)


def test_free_route_reads_like_vllm_and_keeps_bad_text() -> None:
    """The free route reads calls at the end (a value ends at `</parameter>`, the next parameter
    or `</function>`; one newline stripped each side; values converted by the declared types);
    an undeclared function or a call without its framing stays content."""
    stream = ToolStream(constrained=False, codings=CODINGS)
    pieces = ["Sure.\n\n", OPEN, "\n<function=ping>\n<parameter=n>\n7\n<parameter=s>\n 8 \n"
              "</function>\n", CLOSE, "\n", OPEN, "\n<function=nope>\n</function>\n", CLOSE,
              OPEN, "garbage"]
    events = _feed_all(stream, pieces, random.Random(0)) + stream.finish(complete=True)
    calls = stream.tool_calls()
    assert [(c.name, json.loads(c.arguments_json)) for c in calls] == [("ping", {"n": 7,
                                                                                 "s": " 8 "})]
    assert stream.text().startswith("Sure.") and "<function=nope>" in stream.text() \
        and stream.text().endswith("<tool_call>garbage")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == stream.text()


@pytest.mark.parametrize("text,types,value", [
    ("42", ("integer",), 42), ("4.5", ("number",), 4.5), ("True", ("boolean",), True),
    ("None", ("null", "string"), None), ("null", ("string",), "null"), ("x", ("integer",), "x"),
    ("{'a': [1]}", ("object",), {"a": [1]}), ("[1, 2]", (), [1, 2]), ("hi", (), "hi"),
    (" 3 ", ("integer",), 3)])
def test_value_conversion(text, types, value) -> None:
    """Non-strict values follow their declared types (hints), the Qwen template's Python scalars
    included; what fits nothing stays the text."""
    assert convert_value(text, types) == value


def test_render_call_reads_back() -> None:
    """The template's call text read by the constrained stream gives the same arguments (strings
    raw, JSON values otherwise)."""
    args = {"city": "Rome\n ", "days": [1, 2]}
    text = render_call("lookup", json.dumps(args))
    stream = ToolStream(constrained=True, codings=CODINGS)
    inner = text[len("<tool_call>"):-len("</tool_call>")]
    for p in [OPEN, inner, CLOSE]:
        stream.feed(p)
    stream.finish(complete=True)
    assert json.loads(stream.tool_calls()[0].arguments_json) == args


def test_continuation_tokens(frontend) -> None:
    """A continued prefix as tokens: the spelled opener as its control token, every other byte as
    its byte-level token; a prefix holding a completed call is refused."""
    prefix = "Let me check.\n\n<tool_call>\n<function=lookup>\n<parameter=city>\nPar"
    ids = frontend.continuation_tokens(prefix.encode())
    opener = frontend.domain.special_id("<tool_call>")
    assert ids.count(opener) == 1
    rest = b"".join(frontend.domain.token_bytes[t] for t in ids if t != opener)
    assert rest == prefix.replace("<tool_call>", "").encode()
    assert all(len(frontend.domain.token_bytes[t]) == 1 for t in ids if t != opener)
    with pytest.raises(InvalidRequest):
        frontend.continuation_tokens(b"<tool_call>\n<function=a>\n</function>\n</tool_call>")
