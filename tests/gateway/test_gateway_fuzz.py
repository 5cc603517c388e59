"""Fuzzing the gateway (issue 11 §1 "Goal"): hypothesis strategies over each protocol's request
shape, mostly well-formed with every field sometimes replaced by chaos (wrong types, lone
surrogates, huge numbers, NaN, deep nesting, unknown keys), sent as raw bytes (sometimes cut
short, sometimes invalid UTF-8) to a real gateway over loopback: 0 responses with status >= 500,
no internal error inside a 200 stream, and a normal request served afterwards.

The worker behind it is the scripted fake, except that every request it receives goes through
the worker contract's protobuf codec first (what the gRPC path does): a value the gateway lets
through that the contract cannot carry is a server error here.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shared.errors import InfernixError, InternalError
from shared.proto import generation_codec as codec
from tests.support.fake_worker import FakeWorker, GatewayThread

MODEL = "smollm2"
EXAMPLES = 120  # per protocol; the whole module runs in a few seconds


class CodecWorker(FakeWorker):
    """The fake worker, but requests must survive the protobuf codec round trip unchanged."""

    async def generate(self, request):
        try:
            same = codec.request_from_proto(codec.request_to_proto(request))
        except InfernixError:  # a typed refusal of the codec (an id outside int64) is the answer
            raise
        except Exception as exc:  # noqa: BLE001 - the gateway let through what gRPC cannot carry
            raise InternalError(f"the worker contract cannot carry this request: {exc}") from None
        if same != request:
            raise InternalError("the request changed in the codec round trip")
        async for event in super().generate(request):
            yield event


@pytest.fixture(scope="module")
def gateway():
    with GatewayThread(CodecWorker()) as gw:
        yield gw


# ---- strategies ----------------------------------------------------------------------------

_SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\ud83d", "ok\ud83d\ude00"])
_text = st.text(max_size=12)


def _deep(levels: int) -> Any:
    value: Any = 0
    for _ in range(levels):
        value = [value]
    return value


_chaos = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 40), st.sampled_from([2**63, -2**64, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True), _text, _SURROGATES, st.just([]), st.just({}),
    st.lists(st.integers(), max_size=3), st.dictionaries(_text, st.integers(), max_size=2),
    st.sampled_from([_deep(40), _deep(70), {"a": _deep(66)}]),
)


def rarely(good: st.SearchStrategy, other: st.SearchStrategy, one_in: int) -> st.SearchStrategy:
    """`other` about once in `one_in` draws, else `good` (hypothesis favours the bounds of an
    integer range, so the pick is a residue, not a bound)."""
    return st.integers(0, 1000 * one_in).flatmap(lambda i: other if i % one_in == 1 else good)


def f(good: st.SearchStrategy) -> st.SearchStrategy:
    """A field: its (mostly well-formed) value, chaos about once in 25 fields, so that about
    half of the bodies are valid enough to reach the worker."""
    return rarely(good, _chaos, 25)


def obj(required: dict, optional: dict) -> st.SearchStrategy:
    """An object with its fields and, about once in 40, an unknown key."""
    base = st.fixed_dictionaries({k: f(v) for k, v in required.items()},
                                 optional={k: f(v) for k, v in optional.items()})
    extra = st.dictionaries(st.sampled_from(["x_unknown", "guided_json", "top_k", "\ud800"]),
                            _chaos, min_size=1, max_size=1)
    return rarely(base, st.builds(lambda a, b: {**a, **b}, base, extra), 40)


_schema = st.recursive(
    st.sampled_from([{}, True, {"type": "string"}, {"type": "integer", "minimum": 0},
                     {"type": "objekt"}, {"enum": ["a", "\ud800"]}, {"type": "string",
                                                                    "pattern": "^[a-z]+$"}]),
    lambda kids: st.one_of(
        st.builds(lambda p, r: {"type": "object", "properties": p, "required": r,
                                "additionalProperties": False},
                  st.dictionaries(st.sampled_from(["a", "b", "\ud800"]), kids, max_size=2),
                  st.lists(st.sampled_from(["a", "b", "c"]), max_size=2)),
        st.builds(lambda i: {"type": "array", "items": i}, kids),
        st.builds(lambda a: {"anyOf": a}, st.lists(kids, max_size=2))),
    max_leaves=6)
_constraint_ext = st.one_of(
    st.builds(lambda r: {"regex": r}, st.sampled_from(["[0-9]+", "(a|b", "\\p{L}", "\ud800"])),
    st.builds(lambda g: {"grammar": g}, st.sampled_from(['root ::= "a"', "root ::=", "x"])),
    st.builds(lambda c: {"choice": c}, st.lists(_text, max_size=3)),
    st.just({"regex": "a", "choice": ["a"]}))
_stop = st.one_of(_text, st.lists(_text, max_size=3))
_number = rarely(st.floats(0.0, 1.0), st.floats(-0.5, 2.5), 8)


def odd(good: st.SearchStrategy, bad: st.SearchStrategy) -> st.SearchStrategy:
    """A documented value, sometimes one this server refuses."""
    return rarely(good, bad, 12)
_chat_tool = obj({"type": st.sampled_from(["function", "custom"]),
                  "function": obj({"name": st.sampled_from(["f", "g", "a b", ""])},
                                  {"description": _text, "parameters": _schema,
                                   "strict": st.booleans()})}, {})
_content = st.one_of(_text, _text, st.lists(obj({"type": odd(st.just("text"), st.just("image_url")),
                                                "text": _text}, {}), max_size=2))
_calls = st.lists(obj({"id": _text, "type": st.just("function"),
                       "function": obj({"name": st.just("f"), "arguments": odd(
                           st.just('{"a":1}'), st.sampled_from(["{", "[]", "NaN"]))}, {})}, {}),
                  min_size=1, max_size=2)
_chat_message = rarely(st.one_of(
    obj({"role": st.sampled_from(["user", "user", "system", "developer"]), "content": _content},
        {"name": odd(st.just("bob"), _SURROGATES)}),
    obj({"role": st.just("assistant"), "content": _content},
        {"tool_calls": _calls, "refusal": odd(st.none(), _text)}),
    obj({"role": st.just("tool"), "tool_call_id": _text, "content": _content}, {})),
    obj({"role": st.just("robot"), "content": _text}, {}), 15)
CHAT = obj(
    {"model": st.just(MODEL), "messages": st.lists(_chat_message, min_size=1, max_size=4)},
    {"temperature": _number, "top_p": _number, "n": st.integers(0, 3),
     "max_tokens": st.integers(-1, 30), "max_completion_tokens": st.integers(0, 30),
     "seed": odd(st.integers(-2**63, 2**63 - 1), st.integers()), "stop": _stop,
     "stream": st.booleans(),
     "stream_options": obj({}, {"include_usage": st.booleans()}),
     "response_format": st.one_of(
         st.just({"type": "json_object"}), st.just({"type": "text"}),
         st.builds(lambda s: {"type": "json_schema", "json_schema": {"name": "s", "schema": s}},
                   _schema)),
     "structured_outputs": _constraint_ext, "tools": st.lists(_chat_tool, max_size=3),
     "tool_choice": st.one_of(st.sampled_from(["auto", "none", "required", "any"]),
                              st.just({"type": "function", "function": {"name": "f"}})),
     "parallel_tool_calls": st.booleans(), "logprobs": odd(st.just(False), st.just(True)),
     "metadata": st.just({}),
     "presence_penalty": _number, "frequency_penalty": _number, "user": _text})
COMPLETIONS = obj(
    {"model": st.just(MODEL),
     "prompt": odd(st.one_of(_text, st.lists(_text, min_size=1, max_size=3)),
                   st.one_of(st.just([]), st.lists(st.integers(), max_size=2)))},
    {"max_tokens": st.integers(-1, 30), "n": st.integers(0, 3), "temperature": _number,
     "stop": _stop, "stream": st.booleans(), "echo": odd(st.just(False), st.just(True)),
     "seed": st.integers(-2**63, 2**63 - 1), "structured_outputs": _constraint_ext,
     "best_of": odd(st.just(1), st.integers(0, 3))})
_resp_item = st.one_of(
    obj({"role": st.sampled_from(["user", "assistant", "system", "developer", "tool"]),
         "content": st.one_of(_text, st.lists(obj({"type": st.sampled_from(
             ["input_text", "output_text", "input_image"]), "text": _text}, {}), max_size=2))},
        {"type": st.just("message"), "id": _text, "status": _text}),
    obj({"type": st.just("function_call"), "call_id": _text, "name": st.just("f"),
         "arguments": st.sampled_from(['{"a":1}', "{"])}, {}),
    obj({"type": st.just("function_call_output"), "call_id": _text, "output": _text}, {}),
    rarely(st.just({"role": "user", "content": "u"}),
           obj({"type": st.sampled_from(["reasoning", "item_reference"])}, {}), 4))
RESPONSES = obj(
    {"model": st.just(MODEL), "input": st.one_of(_text, st.lists(_resp_item, min_size=1,
                                                                 max_size=4))},
    {"instructions": _text, "max_output_tokens": st.integers(-1, 30), "temperature": _number,
     "top_p": _number, "stream": st.booleans(),
     "text": obj({}, {"format": st.one_of(
         st.just({"type": "json_object"}),
         st.builds(lambda s: {"type": "json_schema", "name": "s", "schema": s}, _schema))}),
     "tools": st.lists(obj({"type": st.just("function"), "name": st.sampled_from(["f", "g"])},
                           {"parameters": _schema, "strict": st.booleans()}), max_size=2),
     "tool_choice": st.one_of(st.sampled_from(["auto", "required", "none"]),
                              st.just({"type": "function", "name": "f"})),
     "structured_outputs": _constraint_ext,
     "include": odd(st.just(["reasoning.encrypted_content"]), st.lists(_text, max_size=2)),
     "truncation": odd(st.just("disabled"), st.just("auto")), "store": st.booleans(),
     "previous_response_id": odd(st.none(), _text)})
_block = st.one_of(
    obj(
        {"type": st.just("text"), "text": _text}, {"cache_control": st.just({"type": "ephemeral"})}
    ),
    obj(
        {
            "type": st.just("tool_use"),
            "id": _text,
            "name": st.just("f"),
            "input": st.just({"a": 1}),
        },
        {},
    ),
    obj(
        {"type": st.just("tool_result"), "tool_use_id": _text},
        {"content": _text, "is_error": st.booleans()},
    ),
    rarely(
        st.just({"type": "text", "text": "t"}),
        obj({"type": st.sampled_from(["image", "thinking", "document"])}, {}),
        4,
    ),
)
MESSAGES = obj(
    {"model": st.just(MODEL), "max_tokens": st.integers(-1, 30),
     "messages": st.lists(obj({"role": odd(st.sampled_from(["user", "assistant"]),
                                           st.just("system")),
                               "content": st.one_of(_text, _text, st.lists(_block, max_size=3))},
                              {}), min_size=1, max_size=4)},
    {"system": st.one_of(_text, st.lists(_block, max_size=2)), "temperature": _number,
     "top_p": _number, "top_k": st.integers(-1, 50), "stream": st.booleans(),
     "stop_sequences": st.lists(_text, max_size=2),
     "tools": st.lists(obj({"name": st.sampled_from(["f", "g", "bad name"]),
                            "input_schema": _schema}, {"strict": st.booleans(),
                                                       "description": _text}), max_size=2),
     "tool_choice": st.one_of(st.just({"type": "auto"}), st.just({"type": "tool", "name": "f"}),
                              st.just({"type": "any", "disable_parallel_tool_use": True})),
     "output_config": obj({}, {"format": st.builds(
         lambda s: {"type": "json_schema", "schema": s}, _schema)}),
     "output_format": st.builds(lambda s: {"type": "json_schema", "schema": s}, _schema),
     "thinking": odd(st.just({"type": "disabled"}), st.just({"type": "enabled",
                                                            "budget_tokens": 9})),
     "structured_outputs": _constraint_ext, "metadata": st.just({"user_id": "u"})})


def encode(body: Any, how: int) -> bytes:
    """The bytes a client might send: JSON with escapes, raw UTF-8 (surrogates passed through as
    invalid UTF-8), or a body cut short."""
    if how == 0:
        return json.dumps(body, ensure_ascii=True).encode()
    text = json.dumps(body, ensure_ascii=False)
    data = text.encode("utf-8", "surrogatepass")
    return data if how == 1 else data[: len(data) // 2]


def check(gateway: GatewayThread, route: str, body: Any, how: int) -> None:
    status, reply = gateway.post(route, encode(body, how))
    assert status < 500, (route, status, reply[:300])
    if status == 200 and reply.startswith((b"data:", b"event:")):
        for marker in (b'"server_error"', b'"api_error"', b'"internal_error"'):
            assert marker not in reply, (route, reply[:600])
    if len(gateway.worker.requests) > 200:
        gateway.worker.reset()


_FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much])
_HOW = st.sampled_from([0, 0, 0, 1, 2])


@_FUZZ
@given(body=CHAT, how=_HOW)
def test_fuzz_chat(gateway, body, how):
    """Chat Completions request shapes: never a 5xx."""
    check(gateway, "/v1/chat/completions", body, how)


@_FUZZ
@given(body=COMPLETIONS, how=_HOW)
def test_fuzz_completions(gateway, body, how):
    """Completions request shapes: never a 5xx."""
    check(gateway, "/v1/completions", body, how)


@_FUZZ
@given(body=RESPONSES, how=_HOW)
def test_fuzz_responses(gateway, body, how):
    """Responses request shapes: never a 5xx."""
    check(gateway, "/v1/responses", body, how)


@_FUZZ
@given(body=MESSAGES, how=_HOW, count=st.booleans())
def test_fuzz_messages(gateway, body, how, count):
    """Messages (and count_tokens) request shapes: never a 5xx."""
    check(gateway, "/v1/messages/count_tokens" if count else "/v1/messages", body, how)


@settings(max_examples=60, deadline=None, database=None)
@given(data=st.binary(max_size=64) | st.sampled_from(
    [b"", b"{", b"[" * 100_000, b'{"model": "smollm2", "messages": [' * 30_000, b"\xff\xfe{}",
     b'{"a": "\\ud800"}', b"null", b"1e999999"]),
    route=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/responses",
                           "/v1/messages", "/v1/messages/count_tokens"]))
def test_fuzz_raw_bytes(gateway, data, route):
    """Arbitrary bytes on every route: never a 5xx."""
    status, reply = gateway.post(route, data)
    assert status < 500, (route, status, reply[:300])


def test_a_normal_request_is_served_after_the_fuzzing(gateway):
    """"... and the server serves a normal request afterwards" (runs after the fuzz tests)."""
    gateway.worker.reset()
    for route, body in [
            ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user",
                                                                    "content": "hi"}]}),
            ("/v1/messages", {"model": MODEL, "max_tokens": 5,
                              "messages": [{"role": "user", "content": "hi"}]})]:
        status, reply = gateway.post(route, json.dumps(body).encode())
        assert status == 200, reply
    assert len(gateway.worker.requests) == 2
