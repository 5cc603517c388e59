"""Tool choices on the real embedded default (the built-in SmolLM2 on the CPU) behind a real
gateway, through the official `openai` and `anthropic` SDKs: forced calls always produce a call
whose arguments satisfy the tool's schema (checked with `jsonschema`, an independent validator),
whether or not the tool is strict."""

from __future__ import annotations

import json

import jsonschema
import pytest

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
# What the SDKs send by default: no `strict`, no additionalProperties.
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 40},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city"]}
CLOSED = {**WEATHER, "additionalProperties": False}
ASK = "What is the weather in Paris?"
CHAT_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "ping"}}]


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


async def _chat_stream_calls(chat, **ask) -> tuple[dict[int, list[str]], str]:
    """{call index: [name, arguments]} and the finish reason of a streamed chat reply."""
    calls: dict[int, list[str]] = {}
    finish = None
    async for chunk in await chat.chat.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                entry = calls.setdefault(delta.index, ["", ""])
                entry[0] += delta.function.name or ""
                entry[1] += delta.function.arguments or ""
            finish = choice.finish_reason or finish
    return calls, finish


async def test_a_chat_call_cut_by_the_limit_is_kept_as_in_the_stream(chat):
    """"A tool call cut by the token limit shows in the stream but is missing from the non-stream
    reply: the two must agree (OpenAI returns the partial call with finish_reason length)"."""
    ask = dict(model="smollm2", messages=[{"role": "user", "content": ASK}], tools=CHAT_TOOLS,
               tool_choice={"type": "function", "function": {"name": "get_weather"}},
               max_tokens=24, temperature=0)
    reply = await chat.chat.completions.create(**ask)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    [call] = choice.message.tool_calls
    streamed, finish = await _chat_stream_calls(chat, **ask)
    assert finish == "length"
    assert streamed == {0: [call.function.name, call.function.arguments]}
    assert call.function.name == "get_weather" and call.function.arguments
    with pytest.raises(ValueError):  # the partial arguments, as published
        json.loads(call.function.arguments)


async def test_required_keeps_the_complete_calls_before_the_cut_one(chat):
    """With `required` and parallel calls on, the model may repeat the call until the budget
    cuts one: the complete calls are kept, the cut one is reported as in the stream, and the
    reply ends `length`; `parallel_tool_calls: false` ends after one call with `tool_calls`."""
    ask = dict(model="smollm2", messages=[{"role": "user", "content": "Ping the server."}],
               tools=[CHAT_TOOLS[1]], tool_choice="required", temperature=0, max_tokens=120)
    whole = await chat.chat.completions.create(**ask)
    calls = whole.choices[0].message.tool_calls
    assert calls and all(json.loads(c.function.arguments) == {} for c in calls)
    # a budget that ends inside the last call of the reply above
    ask["max_tokens"] = whole.usage.completion_tokens - 2
    cut = await chat.chat.completions.create(**ask)
    choice = cut.choices[0]
    assert choice.finish_reason == "length"
    kept = choice.message.tool_calls
    assert len(kept) == len(calls)
    assert [c.function.arguments for c in kept[:-1]] == [c.function.arguments for c in calls[:-1]]
    assert calls[-1].function.arguments.startswith(kept[-1].function.arguments)  # cut
    streamed, _ = await _chat_stream_calls(chat, **ask)
    assert [streamed[i] for i in sorted(streamed)] == \
        [[c.function.name, c.function.arguments] for c in kept]
    single = await chat.chat.completions.create(**{**ask, "max_tokens": 120,
                                                   "parallel_tool_calls": False})
    assert single.choices[0].finish_reason == "tool_calls"
    assert len(single.choices[0].message.tool_calls) == 1


async def test_a_responses_call_cut_by_the_limit_is_kept_as_in_the_stream(chat):
    """Responses: the cut call is a `function_call` item with status `incomplete`, in the
    aggregate as in `response.incomplete` of the stream."""
    ask = dict(model="smollm2", input=ASK, max_output_tokens=24, temperature=0,
               tools=[{"type": "function", "name": "get_weather", "parameters": WEATHER,
                       "strict": False}],
               tool_choice={"type": "function", "name": "get_weather"})
    response = await chat.responses.create(**ask)
    assert response.status == "incomplete"
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.status == "incomplete" and call.arguments
    final = None
    async with chat.responses.stream(**ask) as stream:
        async for event in stream:  # (the SDK's get_final_response wants response.completed)
            if event.type == "response.incomplete":
                final = event.response
    [streamed] = [item for item in final.output if item.type == "function_call"]
    assert (streamed.status, streamed.name, streamed.arguments) == \
        ("incomplete", call.name, call.arguments)


async def test_an_anthropic_call_cut_by_the_limit_is_kept_as_in_the_stream(claude):
    """Messages: the cut tool_use block keeps the input read as far as it goes, the same input
    the SDK accumulates from the stream; stop_reason max_tokens."""
    ask = dict(model="smollm2", max_tokens=24, extra_body={"temperature": 0},
               messages=[{"role": "user", "content": ASK}],
               tools=[{"name": "get_weather", "input_schema": WEATHER}],
               tool_choice={"type": "tool", "name": "get_weather"})
    message = await claude.messages.create(**ask)
    assert message.stop_reason == "max_tokens"
    [use] = [b for b in message.content if b.type == "tool_use"]
    async with claude.messages.stream(**ask) as stream:
        final = await stream.get_final_message()
    [streamed] = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "max_tokens"
    assert (streamed.name, streamed.input) == (use.name, use.input) == ("get_weather", use.input)


async def test_disable_parallel_tool_use_allows_one_call(claude):
    """Anthropic `disable_parallel_tool_use` is enforced in the grammar as `parallel_tool_calls:
    false` is: `any` then ends after exactly one call, with stop_reason tool_use."""
    message = await claude.messages.create(
        model="smollm2", max_tokens=120, extra_body={"temperature": 0},
        messages=[{"role": "user", "content": "Ping the server."}],
        tools=[{"name": "ping", "input_schema": {"type": "object", "properties": {}}}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert message.stop_reason == "tool_use"
    assert [b.input for b in message.content if b.type == "tool_use"] == [{}]


def _pairs_repeat(text: str) -> bool:
    """Whether some object of the JSON `text` repeats a name (Python's json parser reports its
    pairs before keeping one of them)."""
    found = []

    def pairs(items):
        names = [k for k, _ in items]
        found.append(len(names) != len(set(names)))
        return dict(items)

    json.loads(text, object_pairs_hook=pairs)
    return any(found)


async def test_a_count_of_free_names_in_arguments_is_filled_by_distinct_names(chat):
    """"No generated object may repeat a name": a strict tool whose argument holds an open
    object with `minProperties` compiles (the JSON name companion reads the call's arguments;
    without it the count was refused) and the generated arguments repeat no name and satisfy
    the schema."""
    labels = {"type": "object", "properties": {"labels": {
        "type": "object", "minProperties": 2, "maxProperties": 3,
        "additionalProperties": {"type": "integer"}}}, "required": ["labels"],
        "additionalProperties": False}
    reply = await chat.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Label the photo."}],
        tools=[{"type": "function", "function": {"name": "tag", "parameters": labels,
                                                 "strict": True}}],
        tool_choice="required", parallel_tool_calls=False, max_tokens=80, temperature=0)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    [call] = choice.message.tool_calls
    assert not _pairs_repeat(call.function.arguments), call.function.arguments
    jsonschema.validate(json.loads(call.function.arguments), labels)
