"""Tool choices on the real embedded default (the built-in SmolLM2 on the CPU) behind a real
gateway, through the official `openai` and `anthropic` SDKs: forced calls always produce a call
whose arguments satisfy the tool's schema (checked with `jsonschema`, an independent validator),
whether or not the tool is strict."""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.fake_worker import running_gateway

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
# What the SDKs send by default: no `strict`, no additionalProperties.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
CLOSED = {**WEATHER, "additionalProperties": False}
ASK = "What is the weather in Paris?"
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "ping"}}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def gateway_url():
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    worker = open_in_process(load_runtime(), EngineConfig(max_batch=2, max_len=1024))
    try:
        async with running_gateway(worker) as url:
            yield url
    finally:
        await worker.aclose()


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def chat(gateway_url):
    async with openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="k", max_retries=0,
                                  timeout=300) as sdk:
        yield sdk


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def claude(gateway_url):
    async with anthropic.AsyncAnthropic(base_url=gateway_url, api_key="k", max_retries=0,
                                        timeout=300) as sdk:
        yield sdk


@pytest.mark.parametrize("tool_choice, name", [
    ("required", None),
    ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
    ({"type": "function", "function": {"name": "ping"}}, "ping"),
], ids=["required", "named", "named-without-parameters"])
async def test_forced_chat_calls_follow_non_strict_schemas(chat, tool_choice, name):
    """A forced call is constrained by its schema whether or not `strict` is set; a tool with no
    parameters gets `{}`; "a required or named choice always produces a call"."""
    reply = await chat.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS,
        tool_choice=tool_choice, parallel_tool_calls=False, max_tokens=60, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert name is None or call.function.name == name
    args = json.loads(call.function.arguments)
    if call.function.name == "ping":
        assert args == {}
    else:
        jsonschema.validate(args, CLOSED)


async def test_forced_anthropic_call_follows_a_non_strict_schema(claude):
    """Anthropic `any` forces a call; its input satisfies the (non-strict) input_schema."""
    message = await claude.messages.create(
        model="smollm2", max_tokens=60, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": ASK}],
        tools=[{"name": "get_weather", "input_schema": WEATHER}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert message.stop_reason == "tool_use", message
    [use] = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather"
    jsonschema.validate(use.input, CLOSED)


async def test_forced_responses_call_follows_a_non_strict_schema(chat):
    """Responses: a named choice of a `strict: false` tool gives one call of valid arguments."""
    response = await chat.responses.create(
        model="smollm2", input=ASK, max_output_tokens=60, temperature=0,
        tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER,
                "strict": False}],
        tool_choice={"type": "function", "name": "get_weather"})
    [call] = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and call.status == "completed"
    jsonschema.validate(json.loads(call.arguments), CLOSED)
