"""OpenAI Responses through the gateway, driven by the official `openai` SDK."""

from __future__ import annotations

import json

import openai
import pytest
import pytest_asyncio

from shared.contract import ConstraintKind, ToolMode
from shared.errors import SchemaSource, UnsupportedSchema
from shared.generation import FinishReason
from tests.support.fake_worker import FakeWorker, Script, ScriptedCall, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "pattern": "^[A-Z]"}},
          "required": ["city"], "additionalProperties": False}


def fn(name: str, params: dict, **extra) -> dict:
    return {"type": "function", "name": name, "parameters": params, **extra}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker()
    async with running_gateway(worker) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            yield worker, client


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served[0].reset()
    return served


async def test_input_items_and_fields_map_to_the_contract(gw):
    """"OpenAI Responses | text.format json_object/json_schema; tool strict and tool_choice"."""
    worker, client = gw
    await client.responses.create(
        model=MODEL,
        instructions="be brief",
        input=[
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
            {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city":"Oslo"}'},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
            {"type": "message", "role": "developer", "content": "answer in JSON"},
        ],
        text={"format": {"type": "json_schema", "name": "r", "schema": SCHEMA, "strict": True}},
        tools=[fn("w", SCHEMA, strict=False), fn("x", SCHEMA)],
        tool_choice={"type": "function", "name": "x"},
        max_output_tokens=40,
        temperature=0.5,
        top_p=0.8,
    )
    req = worker.last
    assert req.request_id.startswith("resp_")
    assert [(m.role, m.content) for m in req.prompt.messages] == [
        ("system", "be brief"), ("user", "weather?"), ("assistant", None), ("tool", "sunny"),
        ("system", "answer in JSON")]
    call = req.prompt.messages[2].tool_calls[0]
    assert (call.id, call.name, json.loads(call.arguments_json)) == ("c1", "w", {"city": "Oslo"})
    assert req.options.constraint.kind is ConstraintKind.JSON_SCHEMA
    assert json.loads(req.options.constraint.source) == SCHEMA
    # strict: explicit false kept; an omitted strict takes the Responses default (true).
    assert [(t.name, t.strict) for t in req.prompt.tools] == [("w", False), ("x", True)]
    c = req.options.tool_choice
    assert (c.mode, c.allowed_names, c.parallel) == (ToolMode.REQUIRED, ("x",), False)
    assert (req.options.max_tokens, req.options.sampling.temperature,
            req.options.sampling.top_p) == (40, 0.5, 0.8)


async def test_stream_event_sequence(gw):
    """"SSE streams end with the protocol's own terminal event, carrying the finish reason and
    the constraint report"; function_call_arguments.delta reassemble to the final arguments."""
    worker, client = gw
    report = {"branch": "tools", "complete": True}
    calls = (ScriptedCall("c7", "w", ('{"city":', '"Rome"}')),)
    worker.script = Script(text=("Let me ", "check."), calls=calls, constraint=report)
    whole = await client.responses.create(model=MODEL, input="hi", tools=[fn("w", SCHEMA)])
    events = [e async for e in await client.responses.create(
        model=MODEL, input="hi", tools=[fn("w", SCHEMA)], stream=True)]
    types = [e.type for e in events]
    assert types == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done",
        "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert args == done.arguments == "".join(calls[0].fragments)
    final = events[-1].response
    assert final.output_text == whole.output_text == "Let me check."
    streamed_call = [o for o in final.output if o.type == "function_call"][0]
    whole_call = [o for o in whole.output if o.type == "function_call"][0]
    assert (streamed_call.call_id, streamed_call.name, streamed_call.arguments) == \
        (whole_call.call_id, whole_call.name, whole_call.arguments)
    assert final.model_extra["infernix"] == {"constraint": report}
    assert final.usage.output_tokens == 5


async def test_length_is_incomplete(gw):
    """"Users may interrupt through the generation limit ...; the result is then explicitly
    incomplete": a length finish ends with response.incomplete."""
    worker, client = gw
    worker.script = Script(text=("abc",), finish_reason=FinishReason.LENGTH)
    events = [e async for e in await client.responses.create(model=MODEL, input="hi",
                                                             stream=True, max_output_tokens=1)]
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


async def test_errors_name_the_field(gw):
    """Errors name the original field path: text.format.schema/<pointer>, tools[i]..., and
    non-function tool types are rejected as unsupported."""
    worker, client = gw
    worker.script = Script(
        raise_before=UnsupportedSchema("pattern anchors", pointer="/properties/city/pattern")
    )
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, input="hi", text={"format": {
            "type": "json_schema", "name": "r", "schema": SCHEMA}})
    assert info.value.param == "text.format.schema/properties/city/pattern"
    worker.script = Script(raise_before=UnsupportedSchema(
        "x", pointer="/required", source=SchemaSource.TOOL_ARGUMENTS, tool_index=1))
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, input="hi", tools=[fn("a", {}), fn("b", SCHEMA)])
    assert info.value.param == "tools[1].parameters/required"
    worker.reset()
    cases = [({"tools": [{"type": "web_search"}]}, "tools[0].type"),
             ({"previous_response_id": "resp_1"}, "previous_response_id"),
             ({"input": [{"type": "reasoning", "summary": [], "content": [
                 {"type": "summary_text", "text": "x"}]}]}, "input[0].content[0].type"),
             ({"reasoning": {"effort": "extreme"}}, "reasoning.effort"),
             ({"tool_choice": "sometimes"}, "tool_choice"),
             ({"text": {"format": {"type": "json_schema", "name": "r"}}}, "text.format.schema")]
    for extra, param in cases:
        body = {"input": "hi", **extra}
        with pytest.raises(openai.BadRequestError) as info:
            await client.responses.create(model=MODEL, input=body.pop("input"), extra_body=body)
        assert info.value.param == param, info.value.body
    assert worker.requests == []


async def test_worker_dying_mid_stream_is_response_failed(gw):
    """A worker that fails mid-stream produces the protocol's terminal event, response.failed."""
    worker, client = gw
    worker.script = Script(text=("a", "b"), die_after=1)
    events = [e async for e in await client.responses.create(model=MODEL, input="hi", stream=True)]
    assert events[-1].type == "response.failed"
    assert events[-1].response.status == "failed"
    assert events[-1].response.error.code == "internal_error"
    assert worker.cancelled == [worker.last.request_id]
