"""OpenAI Chat Completions through the gateway, driven by the official `openai` SDK."""

from __future__ import annotations

import json

import openai
import pytest
import pytest_asyncio

from shared.contract import ConstraintKind, ToolMode
from shared.errors import InvalidToolDefinition, SchemaSource, UnsupportedSchema
from shared.generation import FinishReason
from tests.support.fake_worker import FakeWorker, Script, ScriptedCall, running_gateway

MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}


def tool(name: str, params: dict, strict: bool = False) -> dict:
    return {"type": "function",
            "function": {"name": name, "description": f"{name} tool", "parameters": params,
                         "strict": strict}}


def resolve(document: object, pointer: str) -> object:
    """RFC 6901 resolution, written independently of the gateway."""
    node = document
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker()
    async with running_gateway(worker) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            yield worker, client


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    worker, client = served
    worker.reset()
    return worker, client


async def test_fields_map_to_the_contract(gw):
    """"OpenAI Chat | response_format json_object/json_schema; tool strict and tool_choice" and
    "OpenAI named maps to Required with one name and parallel=false"."""
    worker, client = gw
    tools = [tool("get_weather", {"type": "object", "properties": {"city": {"type": "string"}}}),
             tool("lookup", SCHEMA, strict=True)]
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_9", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "call_9", "content": "sunny"},
    ]
    await client.chat.completions.create(
        model=MODEL, messages=messages, tools=tools,
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        response_format={"type": "json_schema",
                         "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}},
        max_completion_tokens=33, temperature=0.3, top_p=0.9, seed=11, stop=["END", "STOP"],
        presence_penalty=0.5, frequency_penalty=-0.25)
    req = worker.last
    opts = req.options
    assert opts.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(opts.constraint.source) == SCHEMA
    assert [t.name for t in req.prompt.tools] == ["get_weather", "lookup"]
    assert [t.strict for t in req.prompt.tools] == [False, True]
    assert json.loads(req.prompt.tools[1].parameters_json) == SCHEMA
    assert req.prompt.tools[0].description == "get_weather tool"
    assert (opts.tool_choice.mode, opts.tool_choice.allowed_names, opts.tool_choice.parallel) == \
        (ToolMode.REQUIRED, ("lookup",), False)
    s = opts.sampling
    assert (opts.max_tokens, s.temperature, s.top_p, s.seed, s.presence_penalty,
            s.frequency_penalty, opts.stop) == (33, 0.3, 0.9, 11, 0.5, -0.25, ("END", "STOP"))
    roles = [(m.role, m.content) for m in req.prompt.messages]
    assert roles == [("system", "be brief"), ("user", "ab"), ("assistant", None), ("tool", "sunny")]
    call = req.prompt.messages[2].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments_json)) == ("call_9", "get_weather",
                                                                      {"city": "Oslo"})
    assert req.prompt.messages[3].tool_call_id == "call_9"
    assert req.request_id.startswith("chatcmpl-") and req.model == MODEL


@pytest.mark.parametrize(
    "choice, parallel, expected",
    [
        ("auto", True, (ToolMode.AUTO, None, True)),
        ("none", True, (ToolMode.NONE, None, True)),
        ("required", False, (ToolMode.REQUIRED, None, False)),
        (
            {
                "type": "allowed_tools",
                "allowed_tools": {
                    "mode": "required",
                    "tools": [{"type": "function", "function": {"name": "b"}}],
                },
            },
            True,
            (ToolMode.REQUIRED, ("b",), True),
        ),
    ],
)
async def test_tool_choice_modes(gw, choice, parallel, expected):
    """"Auto allows zero or more calls; Required at least one; parallel=false limits it to one."
    Each OpenAI tool_choice form reaches the worker as the matching ToolChoice."""
    worker, client = gw
    await client.chat.completions.create(
        model=MODEL, messages=USER, tools=[tool("a", {}), tool("b", {})], tool_choice=choice,
        parallel_tool_calls=parallel)
    c = worker.last.options.tool_choice
    assert (c.mode, c.allowed_names, c.parallel) == expected


@pytest.mark.parametrize("ext, kind", [
    ({"grammar": 'root ::= "a"'}, ConstraintKind.GRAMMAR),
    ({"regex": "[0-9]+"}, ConstraintKind.REGEX),
    ({"choice": ["yes", "no", "yes"]}, ConstraintKind.CHOICE),
])
async def test_structured_outputs_extension(gw, ext, kind):
    """"Infernix HTTP extension | grammar, regex and choice in structured_outputs"."""
    worker, client = gw
    await client.chat.completions.create(model=MODEL, messages=USER,
                                         extra_body={"structured_outputs": ext},
                                         response_format={"type": "text"})
    c = worker.last.options.constraint
    assert c.kind is kind
    (key, value), = ext.items()
    if kind is ConstraintKind.CHOICE:
        assert c.choices == tuple(dict.fromkeys(value))
    else:
        assert c.source == value


async def test_json_object_response_format(gw):
    """"OpenAI Chat | response_format json_object"."""
    worker, client = gw
    await client.chat.completions.create(model=MODEL, messages=USER,
                                         response_format={"type": "json_object"})
    assert worker.last.options.constraint.kind is ConstraintKind.JSON_OBJECT


@pytest.mark.parametrize("extra, param", [
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}},
     "structured_outputs"),
    ({"structured_outputs": {"regexp": "a"}}, "structured_outputs.regexp"),
    ({"structured_outputs": {"regex": "a", "grammar": "x"}}, "structured_outputs"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ({"structured_outputs": {"choice": ["a", 3]}}, "structured_outputs.choice[1]"),
    ({"n": 0}, "n"),
    ({"n": 17}, "n"),  # more than max_choices
    ({"temperature": -1}, "temperature"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [tool("a", {}), tool("a", {})]}, "tools[1].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [tool("a", {})], "tool_choice": {"type": "function", "function": {"name": "zz"}}},
     "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     "response_format.json_schema.schema"),
])
async def test_request_errors_name_the_field(gw, extra, param):
    """"A content constraint has one source; a standard response format together with the
    Infernix extension is an error." Every client error is a 400 naming the original field."""
    worker, client = gw
    body = {"messages": USER, **extra}
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=body.pop("messages"),
                                             extra_body=body)
    assert info.value.status_code == 400
    assert info.value.param == param, info.value.body
    assert info.value.body["type"] == "invalid_request_error"
    assert worker.requests == []


async def test_schema_error_pointer_is_prefixed_by_its_location(gw):
    """"Errors name the original field path (response_format.json_schema.schema/properties/x,
    ...)": the path's prefix locates the schema in the request and its pointer resolves there."""
    worker, client = gw
    schema = {"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 7}}}
    worker.script = Script(raise_before=UnsupportedSchema("multipleOf is outside the subset",
                                                          pointer="/properties/age/multipleOf"))
    body = {
        "response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}}
    }
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=USER, extra_body=body)
    param = info.value.param
    location, pointer = param.split("/", 1)
    assert location == "response_format.json_schema.schema"
    assert resolve(body["response_format"]["json_schema"]["schema"], "/" + pointer) == 7
    assert info.value.body["code"] == "unsupported_schema"


async def test_tool_schema_error_names_the_tool(gw):
    """"a tool error names tools[i]": a strict tool's schema error from the worker (source
    tool_arguments, tool_index 1) becomes tools[1].function.parameters + pointer."""
    worker, client = gw
    worker.script = Script(raise_before=UnsupportedSchema(
        "additionalProperties must be false", pointer="/additionalProperties",
        source=SchemaSource.TOOL_ARGUMENTS, tool_index=1, tool_name="b"))
    tools = [tool("a", {}), tool("b", {"type": "object", "additionalProperties": True}, True)]
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=USER, tools=tools)
    location, pointer = info.value.param.split("/", 1)
    assert location == "tools[1].function.parameters"
    assert resolve(tools[1]["function"]["parameters"], "/" + pointer) is True
    worker.script = Script(raise_before=InvalidToolDefinition("bad", tool_index=0, field="name"))
    with pytest.raises(openai.BadRequestError) as info:
        await client.chat.completions.create(model=MODEL, messages=USER, tools=tools)
    assert info.value.param == "tools[0].function.name"


async def test_aggregate_and_stream_agree(gw):
    """"The same reader produces the terminal calls, so the streamed and aggregate calls cannot
    differ": streamed argument deltas reassemble to the final arguments, ids and names arrive in
    each call's first chunk, the finish chunk carries the constraint report, usage comes last."""
    worker, client = gw
    report = {"branch": "tools", "complete": True, "terminated": True}
    calls = (ScriptedCall("call_a", "a", ('{"x":', '1}')),
             ScriptedCall("call_b", "b", ('{"s":"', 'q"', "}")))
    worker.script = Script(text=("Hmm", "."), calls=calls, constraint=report)
    tools = [tool("a", {}), tool("b", {})]
    whole = await client.chat.completions.create(model=MODEL, messages=USER, tools=tools)
    msg = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert msg.content == "Hmm."
    assert [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls] == \
        [(c.id, c.name, "".join(c.fragments)) for c in calls]
    assert whole.model_extra["infernix"] == {"constraint": report}
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens

    stream = await client.chat.completions.create(
        model=MODEL, messages=USER, tools=tools, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assembled: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = assembled.setdefault(d.index, {"id": d.id, "name": d.function.name, "args": ""})
            assert d.id is None or entry["id"] == d.id
            entry["args"] += d.function.arguments or ""
    assert text == msg.content
    assert [(e["id"], e["name"], e["args"]) for _, e in sorted(assembled.items())] == \
        [(c.id, c.function.name, c.function.arguments) for c in msg.tool_calls]
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "tool_calls"
    assert finals[0].model_extra["infernix"] == {"constraint": report}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 5


async def test_length_finish(gw):
    """"A complete JSON stopping exactly at the length limit may record complete content while
    the finish reason stays the length limit; the reason is never rewritten"."""
    worker, client = gw
    worker.script = Script(text=('{"a":1}',), finish_reason=FinishReason.LENGTH,
                           constraint={"complete": True, "terminated": False})
    whole = await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=3)
    assert whole.choices[0].finish_reason == "length"
    assert worker.last.options.max_tokens == 3


async def test_worker_dying_mid_stream_ends_with_an_error_chunk(gw):
    """"SSE streams end with the protocol's own terminal event": a worker failure after the
    first event becomes `data: {"error": ...}`, which the SDK raises as an APIError."""
    worker, client = gw
    worker.script = Script(text=("a", "b", "c"), die_after=2)
    stream = await client.chat.completions.create(model=MODEL, messages=USER, stream=True)
    seen = []
    with pytest.raises(openai.APIError) as info:
        async for chunk in stream:
            seen.append(chunk)
    assert "".join(c.choices[0].delta.content or "" for c in seen) == "ab"
    assert info.value.body["type"] == "server_error"
    assert worker.cancelled == [worker.last.request_id]


async def test_worker_error_finish_is_422_and_unknown_model_404(gw):
    """A request error found while generating (a dead end) is 422; an unknown model is 404."""
    worker, client = gw
    worker.script = Script(text=("x",), error={"type": "ConstraintDeadEnd",
                                                "message": "no legal token", "position": 4})
    with pytest.raises(openai.UnprocessableEntityError) as info:
        await client.chat.completions.create(model=MODEL, messages=USER)
    assert info.value.body["code"] == "constraint_dead_end"
    with pytest.raises(openai.NotFoundError) as info:
        await client.chat.completions.create(model="gpt-9", messages=USER)
    assert info.value.param == "model"
