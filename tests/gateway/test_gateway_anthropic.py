"""Anthropic Messages through the gateway, driven by the official `anthropic` SDK."""

from __future__ import annotations

import json

import anthropic
import pytest
import pytest_asyncio

from shared.contract import ConstraintKind, ToolMode
from shared.errors import SchemaSource, UnsupportedSchema
from shared.generation import FinishReason
from tests.support.fake_worker import FakeWorker, Script, ScriptedCall, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"],
          "additionalProperties": False}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker()
    async with running_gateway(worker) as url:
        async with anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as client:
            yield worker, client


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served[0].reset()
    return served


async def test_fields_map_to_the_contract(gw):
    """"Anthropic Messages | output_config.format JSON Schema; tool definitions, strict and
    tool_choice through the shared tool contract" and "Anthropic named uses one name and honours
    disable_parallel_tool_use"."""
    worker, client = gw
    await client.messages.create(
        model=MODEL,
        max_tokens=64,
        system=[{"type": "text", "text": "sys "}, {"type": "text", "text": "two"}],
        messages=[
            {"role": "user", "content": "search"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "ok"},
                    {"type": "tool_use", "id": "tu1", "name": "find", "input": {"q": "x"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "tu1",
                        "content": [{"type": "text", "text": "found"}],
                    },
                    {"type": "text", "text": "thanks"},
                ],
            },
        ],
        tools=[
            {"name": "find", "description": "search", "input_schema": SCHEMA, "strict": True},
            {"name": "other", "input_schema": {"type": "object"}},
        ],
        tool_choice={"type": "tool", "name": "find", "disable_parallel_tool_use": False},
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
        stop_sequences=["###"],
        # anthropic 2.x no longer types the sampling fields; the protocol still carries them.
        extra_body={"temperature": 0.2, "top_p": 0.7, "top_k": 40},
    )
    req = worker.last
    assert req.request_id.startswith("msg_")
    assert [(m.role, m.content) for m in req.prompt.messages] == [
        ("system", "sys two"), ("user", "search"), ("assistant", "ok"), ("tool", "found"),
        ("user", "thanks")]
    call = req.prompt.messages[2].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments_json)) == ("tu1", "find", {"q": "x"})
    assert req.prompt.messages[3].tool_call_id == "tu1"
    assert not req.prompt.continue_final_assistant
    assert req.options.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(req.options.constraint.source) == SCHEMA
    assert [(t.name, t.strict, t.description) for t in req.prompt.tools] == [
        ("find", True, "search"), ("other", False, None)]
    c = req.options.tool_choice
    assert (c.mode, c.allowed_names, c.parallel) == (ToolMode.REQUIRED, ("find",), True)
    s = req.options.sampling
    assert (req.options.max_tokens, s.temperature, s.top_p, s.top_k, req.options.stop) == \
        (64, 0.2, 0.7, 40, ("###",))


@pytest.mark.parametrize("choice, expected", [
    ({"type": "auto"}, (ToolMode.AUTO, None, True)),
    ({"type": "any", "disable_parallel_tool_use": True}, (ToolMode.REQUIRED, None, False)),
    ({"type": "none"}, (ToolMode.NONE, None, True)),
])
async def test_tool_choice(gw, choice, expected):
    """"Auto allows zero or more calls; Required at least one; parallel=false limits it to one"."""
    worker, client = gw
    await client.messages.create(model=MODEL, max_tokens=8, messages=USER, tool_choice=choice,
                                 tools=[{"name": "a", "input_schema": {"type": "object"}}])
    c = worker.last.options.tool_choice
    assert (c.mode, c.allowed_names, c.parallel) == expected


async def test_final_assistant_message_is_continued(gw):
    """Anthropic prefill: a final assistant message is continued, not answered."""
    worker, client = gw
    await client.messages.create(model=MODEL, max_tokens=8, messages=USER + [
        {"role": "assistant", "content": "{\"a\":"}])
    assert worker.last.prompt.continue_final_assistant
    assert worker.last.prompt.messages[-1].content == "{\"a\":"


async def test_stream_and_aggregate_agree(gw):
    """Streamed input_json_delta fragments reassemble to the aggregate tool input, and the
    terminal message_delta carries the stop reason, usage and constraint report."""
    worker, client = gw
    report = {"branch": "tools", "complete": True, "terminated": True}
    calls = (ScriptedCall("tu_1", "find", ('{"q":', '"a b"}')),
             ScriptedCall("tu_2", "find", ('{"q":"c"}',)))
    worker.script = Script(text=("one ", "two"), calls=calls, constraint=report)
    whole = await client.messages.create(model=MODEL, max_tokens=8, messages=USER)
    assert whole.stop_reason == "tool_use"
    assert whole.model_extra["infernix"] == {"constraint": report}
    raw_events = []
    async with client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
        async for event in stream:
            raw_events.append(event)
        final = await stream.get_final_message()
    partial: dict[int, str] = {}
    for e in raw_events:
        if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
            partial[e.index] = partial.get(e.index, "") + e.delta.partial_json
    assert [json.loads(v) for _, v in sorted(partial.items())] == \
        [b.input for b in whole.content if b.type == "tool_use"]
    assert [b.model_dump(exclude_none=True) for b in final.content] == \
        [b.model_dump(exclude_none=True) for b in whole.content]
    assert (final.stop_reason, final.usage.input_tokens, final.usage.output_tokens) == \
        ("tool_use", 7, 5)
    delta = next(e for e in raw_events if e.type == "message_delta")
    assert delta.model_extra["infernix"] == {"constraint": report}


async def test_stop_reasons(gw):
    """max_tokens and stop_sequence stop reasons follow the worker's finish."""
    worker, client = gw
    worker.script = Script(text=("x",), finish_reason=FinishReason.LENGTH)
    assert (await client.messages.create(model=MODEL, max_tokens=1, messages=USER)).stop_reason \
        == "max_tokens"
    worker.script = Script(text=("x",), stop_sequence="###")
    m = await client.messages.create(model=MODEL, max_tokens=9, messages=USER,
                                     stop_sequences=["###"])
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "###")


async def test_errors_in_anthropic_shape(gw):
    """Errors name the original field path (`tools[2].input_schema/...`) in Anthropic's error
    shape; max_tokens is required by the protocol."""
    worker, client = gw
    with pytest.raises(anthropic.BadRequestError) as info:
        # The SDK refuses to send a request without max_tokens; its generic post sends one.
        await client.post("/v1/messages", cast_to=object, body={"model": MODEL, "messages": USER})
    assert info.value.body["error"]["type"] == "invalid_request_error"
    assert info.value.body["error"]["param"] == "max_tokens"
    tools = [{"name": "a", "input_schema": {"type": "object"}},
             {"name": "b", "input_schema": SCHEMA}]
    worker.script = Script(raise_before=UnsupportedSchema(
        "pattern", pointer="/properties/q", source=SchemaSource.TOOL_ARGUMENTS, tool_index=1))
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model=MODEL, max_tokens=5, messages=USER, tools=tools)
    err = info.value.body["error"]
    assert err["param"] == "tools[1].input_schema/properties/q"
    assert err["message"].startswith("tools[1].input_schema/properties/q")
    worker.script = Script(raise_before=UnsupportedSchema("x", pointer="/required/0"))
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model=MODEL, max_tokens=5, messages=USER, output_config={
            "format": {"type": "json_schema", "schema": SCHEMA}})
    assert info.value.body["error"]["param"] == "output_config.format.schema/required/0"
    worker.reset()
    with pytest.raises(anthropic.BadRequestError) as info:
        await client.messages.create(model=MODEL, max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert info.value.body["error"]["param"] == "messages[0].content[0].type"
    assert worker.requests == []


async def test_worker_dying_mid_stream_is_event_error(gw):
    """A worker that fails mid-stream produces `event: error`, which the SDK raises."""
    worker, client = gw
    worker.script = Script(text=("a", "b"), calls=(ScriptedCall("t", "a", ("{}",)),), die_after=3)
    with pytest.raises(anthropic.APIStatusError) as info:
        async with client.messages.stream(model=MODEL, max_tokens=8, messages=USER) as stream:
            async for _ in stream:
                pass
    assert info.value.body["error"]["type"] == "api_error"
    assert worker.cancelled == [worker.last.request_id]


async def test_count_tokens(gw):
    """`/v1/messages/count_tokens` asks the worker to count the rendered prompt."""
    worker, client = gw
    result = await client.messages.count_tokens(model=MODEL, messages=[
        {"role": "user", "content": "three words here"}])
    assert result.input_tokens == 3
