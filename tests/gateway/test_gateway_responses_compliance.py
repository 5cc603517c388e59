"""The Open Responses compliance suite's HTTP cases (openresponses/openresponses: a basic
answer, streaming, a system message, tool calling aggregate and streamed, multi-turn input, an
image input), as our own data and assertions, over raw HTTP against /v1/responses with the
scripted fake worker (the model does not matter to these checks). Image input is the one case
we refuse: a typed 400 naming the part (no model served here reads images)."""

from __future__ import annotations

import json

import pytest

from tests.support.fake_worker import FakeWorker, GatewayThread, Script, ScriptedCall

WEATHER = {"type": "function", "name": "get_weather", "description": "Weather for a place",
           "parameters": {"type": "object", "properties": {"location": {"type": "string"}},
                          "required": ["location"]}}
CALL = ScriptedCall("call_1", "get_weather", ('{"location": ', '"Oslo"}'))


def user(text: str) -> dict:
    return {"type": "message", "role": "user", "content": text}


# (case, input items, tools, script, streamed)
CASES = [
    ("basic-response", [user("Say hello in three words.")], None, Script(text=("Hi ", "there")),
     False),
    ("streaming-response", [user("Count to five.")], None, Script(text=("1 ", "2 ", "3")), True),
    ("system-prompt", [{"type": "message", "role": "system", "content": "Talk like a pirate."},
                       user("Say hello.")], None, Script(text=("Ahoy",)), False),
    ("tool-calling", [user("Weather in Oslo?")], [WEATHER], Script(calls=(CALL,)), False),
    ("tool-calling-streaming", [user("Weather in Oslo?")], [WEATHER], Script(calls=(CALL,)),
     True),
    ("multi-turn", [user("I am Alice."), {"type": "message", "role": "assistant",
                                          "content": "Hello Alice!"}, user("My name?")],
     None, Script(text=("Alice",)), False),
]


@pytest.fixture(scope="module")
def gateway():
    with GatewayThread(FakeWorker()) as gw:
        yield gw


# The members the Open Responses schema's ResponseResource requires (null where unused).
REQUIRED = ("id object created_at completed_at status incomplete_details model "
            "previous_response_id instructions output error tools tool_choice truncation "
            "parallel_tool_calls text top_p presence_penalty frequency_penalty top_logprobs "
            "temperature reasoning user usage max_output_tokens max_tool_calls store background "
            "service_tier metadata safety_identifier prompt_cache_key").split()


def check_resource(resource: dict) -> None:
    """The response resource's required members, typed as the Open Responses schema has them."""
    missing = [name for name in REQUIRED if name not in resource]
    assert not missing, missing
    for name in ("top_p", "presence_penalty", "frequency_penalty", "temperature"):
        assert isinstance(resource[name], (int, float)), name
    assert isinstance(resource["parallel_tool_calls"], bool)
    assert isinstance(resource["store"], bool) and isinstance(resource["background"], bool)
    assert isinstance(resource["top_logprobs"], int) and isinstance(resource["tools"], list)
    if resource["status"] == "completed":
        assert isinstance(resource["completed_at"], int)
    assert resource["object"] == "response"
    assert isinstance(resource["id"], str) and resource["id"]
    assert isinstance(resource["created_at"], int)
    assert resource["status"] in ("completed", "incomplete", "failed", "in_progress")
    assert isinstance(resource["model"], str)
    assert isinstance(resource["output"], list)
    for item in resource["output"]:
        assert isinstance(item["id"], str) and item["type"] in ("message", "function_call",
                                                                "reasoning")
        if item["type"] == "message":
            assert item["role"] == "assistant" and item["status"] in ("completed", "incomplete")
            assert all(p["type"] == "output_text" and isinstance(p["text"], str)
                       for p in item["content"])
        if item["type"] == "function_call":
            assert isinstance(item["call_id"], str) and isinstance(item["name"], str)
            json.loads(item["arguments"])
    usage = resource["usage"]
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def events(raw: bytes) -> list[dict]:
    out = []
    for block in raw.decode().split("\n\n"):
        data = [line[6:] for line in block.splitlines() if line.startswith("data: ")]
        if data and data[0] != "[DONE]":
            out.append(json.loads("\n".join(data)))
    return out


@pytest.mark.parametrize("case, items, tools, script, streamed", CASES, ids=[c[0] for c in CASES])
def test_open_responses_case(gateway, case, items, tools, script, streamed):
    """Open Responses compliance: each case is a 200 whose response resource (the aggregate, or
    a stream's terminal event) has the schema's members, has output, and completed; a tool case
    has a function_call item, and its stream the function-call events in their order."""
    gateway.worker.reset(script)
    body = {"model": "smollm2", "input": items, "stream": streamed}
    if tools:
        body["tools"] = tools
    status, raw = gateway.post("/v1/responses", json.dumps(body).encode())
    assert status == 200, raw
    if streamed:
        seen = events(raw)
        assert seen and all("type" in e and isinstance(e["sequence_number"], int) for e in seen)
        assert [e["sequence_number"] for e in seen] == list(range(len(seen)))
        assert seen[0]["type"] == "response.created"
        assert seen[-1]["type"] == "response.completed"
        resource = seen[-1]["response"]
        if tools:
            kinds = [(e["type"], e.get("item", {}).get("type")) for e in seen]
            order = [("response.output_item.added", "function_call"),
                     ("response.function_call_arguments.delta", None),
                     ("response.function_call_arguments.done", None),
                     ("response.output_item.done", "function_call")]
            positions = [kinds.index(k) for k in order]
            assert positions == sorted(positions), kinds
    else:
        resource = json.loads(raw)
    check_resource(resource)
    assert resource["output"] and resource["status"] == "completed"
    if tools:
        assert any(item["type"] == "function_call" for item in resource["output"])


def test_image_input_is_refused_by_name(gateway):
    """The suite's image-input case: no served model reads images, so an `input_image` part is
    a typed 400 naming it (documented), never a silently dropped image."""
    gateway.worker.reset(Script(text=("x",)))
    body = {"model": "smollm2", "input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}]}]}
    status, raw = gateway.post("/v1/responses", json.dumps(body).encode())
    assert status == 400, raw
    assert json.loads(raw)["error"]["param"].startswith("input[0].content[1]")
