"""What users of the two APIs expect (issue 11 §3): several choices (`n`, completions prompt
lists), `GET /v1/models/{id}`, several and late system messages, Anthropic stop sequences,
`message_start` input tokens and `toolu_` ids, through the official SDKs."""

from __future__ import annotations

import json

import aiohttp
import anthropic
import openai
import pytest
import pytest_asyncio

from services.gateway.choices import choice_seed
from shared.contract import ConstraintKind
from shared.generation import Usage
from tests.support.fake_worker import FakeWorker, Script, ScriptedCall, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker(served=("smollm2", "other/model"))
    async with running_gateway(worker) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as oa, \
                anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as an:
            yield worker, oa, an, url


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served[0].reset()
    served[0].served = ("smollm2", "other/model")
    return served


async def test_n_choices_are_independent_worker_requests(gw):
    """Issue 11 §3: "n > 1 (independent choices, seeds derived per choice; constrained choices
    each valid)": one worker request per choice, each with the same constraint and its own seed
    (the first keeps the caller's), usage counts the prompt once and sums the completions."""
    worker, client, _, _ = gw
    worker.script = Script(texts=(("x",), ("y",), ("z",)), usage=Usage(11, 4))
    whole = await client.chat.completions.create(
        model=MODEL, messages=USER, n=3, seed=1234, temperature=0.7,
        response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})
    assert [c.index for c in whole.choices] == [0, 1, 2]
    assert [c.message.content for c in whole.choices] == ["x", "y", "z"]
    reqs = worker.requests
    assert len(reqs) == 3 and len({r.request_id for r in reqs}) == 3
    assert all(r.options.constraint.kind is ConstraintKind.JSON_SCHEMA for r in reqs)
    assert all(json.loads(r.options.constraint.source) == SCHEMA for r in reqs)
    seeds = [r.options.sampling.seed for r in reqs]
    assert seeds[0] == 1234 and len(set(seeds)) == 3
    assert all(r.options.sampling.temperature == 0.7 for r in reqs)
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (11, 12)
    # The same request again derives the same seeds; without a seed each request draws its own.
    worker.reset(Script(texts=(("x",),)))
    await client.chat.completions.create(model=MODEL, messages=USER, n=3, seed=1234)
    assert [r.options.sampling.seed for r in worker.requests] == seeds
    worker.reset()
    await client.chat.completions.create(model=MODEL, messages=USER, n=2)
    assert [r.options.sampling.seed for r in worker.requests] == [None, None]


async def test_choice_seeds_are_distinct_and_keep_the_first():
    """Derived seeds: choice 0 is the caller's seed; the others are distinct 63-bit values."""
    for seed in (0, 1, -5, 2**63 - 1):
        derived = [choice_seed(seed, i) for i in range(64)]
        assert derived[0] == seed
        assert len(set(derived)) == 64
        assert all(0 <= d < 2**63 for d in derived[1:])


async def test_n_choices_stream_with_their_indices(gw):
    """Streamed choices carry their index; each index reassembles its own text and tool calls,
    has one finish chunk, and the usage chunk sums the choices."""
    worker, client, _, _ = gw
    worker.script = Script(texts=(("a", "b"), ("c",)), usage=Usage(3, 2),
                           calls=(ScriptedCall("call_1", "f", ('{"q":', '1}')),))
    stream = await client.chat.completions.create(
        model=MODEL, messages=USER, n=2, stream=True, stream_options={"include_usage": True},
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}])
    chunks = [c async for c in stream]
    text = {0: "", 1: ""}
    args = {0: "", 1: ""}
    finishes = {0: [], 1: []}
    for chunk in chunks:
        for choice in chunk.choices:
            text[choice.index] += choice.delta.content or ""
            for call in choice.delta.tool_calls or []:
                args[choice.index] += call.function.arguments or ""
            if choice.finish_reason:
                finishes[choice.index].append(choice.finish_reason)
    assert text == {0: "ab", 1: "c"}
    assert args == {0: '{"q":1}', 1: '{"q":1}'}
    assert finishes == {0: ["tool_calls"], 1: ["tool_calls"]}
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 4
    assert chunks[-1].usage.prompt_tokens == 3


async def test_completions_prompt_lists(gw):
    """Issue 11 §3: "completions with a list of prompts": choice i answers prompt i // n, the
    prompts are counted each once."""
    worker, client, _, _ = gw
    worker.script = Script(texts=(("1",), ("2",), ("3",), ("4",)), usage=Usage(5, 1))
    whole = await client.completions.create(model=MODEL, prompt=["a", "b"], n=2, max_tokens=3)
    assert [r.prompt.text for r in worker.requests] == ["a", "a", "b", "b"]
    assert [c.index for c in whole.choices] == [0, 1, 2, 3]
    assert [c.text for c in whole.choices] == ["1", "2", "3", "4"]
    assert (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (10, 4)
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=MODEL, prompt=["a", "b"], n=9)
    assert info.value.param == "n" and "max_choices=16" in info.value.message
    await client.completions.create(model=MODEL, prompt=[1, 2, 3])  # token ids: one prompt
    assert worker.last.prompt.token_ids == (1, 2, 3) and worker.last.prompt.text is None
    with pytest.raises(openai.BadRequestError) as info:
        await client.completions.create(model=MODEL, prompt=["a", 1])
    assert info.value.param == "prompt[1]"


async def test_get_one_model(gw):
    """Issue 11 §3: `GET /v1/models/{id}` for both SDKs; an unknown id is a 404 in the caller's
    error shape."""
    worker, client, aclient, url = gw
    model = await client.models.retrieve("other/model")
    assert (model.id, model.object) == ("other/model", "model")
    amodel = await aclient.models.retrieve("smollm2")
    assert (amodel.id, amodel.type) == ("smollm2", "model")
    with pytest.raises(openai.NotFoundError) as info:
        await client.models.retrieve("gpt-9")
    assert info.value.body["code"] == "model_not_found"
    with pytest.raises(anthropic.NotFoundError) as ainfo:
        await aclient.models.retrieve("claude-9")
    assert ainfo.value.body["error"]["type"] == "not_found_error"


async def test_several_and_late_system_messages_reach_the_worker(gw):
    """Issue 11 §3: several system/developer messages, and a system message later in the
    conversation, pass the gateway in their places (the template decides how they render)."""
    worker, client, _, _ = gw
    await client.chat.completions.create(model=MODEL, messages=[
        {"role": "system", "content": "s1"}, {"role": "developer", "content": "d1"},
        {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"},
        {"role": "system", "content": "s2"}, {"role": "user", "content": "u2"}])
    assert [(m.role, m.content) for m in worker.last.prompt.messages] == [
        ("system", "s1"), ("system", "d1"), ("user", "u1"), ("assistant", "a1"),
        ("system", "s2"), ("user", "u2")]
    await client.responses.create(model=MODEL, instructions="i", input=[
        {"role": "user", "content": "u1"}, {"role": "developer", "content": "d"},
        {"role": "system", "content": "s"}, {"role": "user", "content": "u2"}])
    assert [(m.role, m.content) for m in worker.last.prompt.messages] == [
        ("system", "i"), ("user", "u1"), ("system", "d"), ("system", "s"), ("user", "u2")]


async def test_anthropic_stop_sequence_and_started_counts(gw):
    """Issue 11 §3: "stop_sequences give stop_reason: "stop_sequence" and the matched
    stop_sequence; message_start.usage.input_tokens is the real count" (from the worker's Started
    event; cached prompt tokens are reported apart, as Anthropic does)."""
    worker, _, aclient, _ = gw
    worker.script = Script(text=("4", "2"), stop_sequence="\n\n", usage=Usage(23, 2),
                           started=True, cached_tokens=8)
    events = []
    async with aclient.messages.stream(model=MODEL, max_tokens=9, messages=USER,
                                       stop_sequences=["###", "\n\n"]) as stream:
        async for event in stream:
            events.append(event)
        final = await stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    assert (start.message.usage.input_tokens, start.message.usage.cache_read_input_tokens) == \
        (23 - 8, 8)
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", "\n\n")
    assert worker.last.options.stop == ("###", "\n\n")
    whole = await aclient.messages.create(model=MODEL, max_tokens=9, messages=USER,
                                          stop_sequences=["\n\n"])
    assert (whole.stop_reason, whole.stop_sequence, whole.usage.input_tokens) == \
        ("stop_sequence", "\n\n", 15)


async def test_message_start_without_started_falls_back_to_zero(gw):
    """A worker that sends no Started event: message_start says 0 and the final usage the real
    count."""
    worker, _, aclient, _ = gw
    worker.script = Script(text=("ok",), usage=Usage(17, 1), started=False)
    async with aclient.messages.stream(model=MODEL, max_tokens=9, messages=USER) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    assert start.message.usage.input_tokens == 0
    assert final.usage.input_tokens == 17


async def test_anthropic_tool_use_ids(gw):
    """Issue 11 §3: "tool-use ids start with toolu_", in the aggregate and the stream alike, and
    the id a client sends back round-trips to the worker unchanged."""
    worker, _, aclient, _ = gw
    worker.script = Script(calls=(ScriptedCall("call_abc", "f", ("{}",)),))
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    whole = await aclient.messages.create(model=MODEL, max_tokens=9, messages=USER, tools=tools)
    ids = [b.id for b in whole.content if b.type == "tool_use"]
    assert ids == ["toolu_abc"]
    async with aclient.messages.stream(model=MODEL, max_tokens=9, messages=USER,
                                       tools=tools) as stream:
        final = await stream.get_final_message()
    assert [b.id for b in final.content if b.type == "tool_use"] == ids
    await aclient.messages.create(model=MODEL, max_tokens=9, tools=tools, messages=USER + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": ids[0], "name": "f",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": ids[0],
                                      "content": "done"}]}])
    msgs = worker.last.prompt.messages
    assert msgs[1].tool_calls[0].id == ids[0] and msgs[2].tool_call_id == ids[0]


async def test_openai_usage_reports_cached_tokens(gw):
    """The Started event's cached prompt tokens appear in each protocol's usage details."""
    worker, client, _, url = gw
    worker.script = Script(text=("ok",), usage=Usage(30, 1), started=True, cached_tokens=12)
    whole = await client.chat.completions.create(model=MODEL, messages=USER)
    assert whole.usage.prompt_tokens_details.cached_tokens == 12
    reply = await client.responses.create(model=MODEL, input="hi")
    assert reply.usage.input_tokens_details.cached_tokens == 12
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/completions", json={"model": MODEL, "prompt": "x"}) as r:
            body = await r.json()
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 12
