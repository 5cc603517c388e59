"""Reasoning in all three protocols, end to end: a tiny random-weight Qwen3.5 checkpoint with the
real vocabulary and chat template in the in-process worker, a real gateway, and the official
`openai` and `anthropic` SDKs (issue 9, sections 2 and 5).

Issue 9: "Publication: Chat `message.reasoning_content` and `delta.reasoning_content` (the field
vLLM and SGLang clients read), Responses `reasoning` output items and their stream events,
Anthropic `thinking` content blocks and `thinking_delta` events. Content bytes after the
separator publish as generated." Independent basis: the same request aggregate and streamed
(greedy: the same output) must agree field by field; JSON content is checked with `jsonschema`.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import openai
import pytest
import pytest_asyncio

from tests.support.fake_worker import running_gateway
from tests.support.qwen35_support import hf_causal_lm

pytestmark = pytest.mark.asyncio(loop_scope="module")
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}
ASK = [{"role": "user", "content": "Is the sky blue?"}]


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tmp_path_factory):
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    path = tmp_path_factory.mktemp("qwen35-e2e")
    hf_causal_lm(seed=7, max_position_embeddings=1024).save_pretrained(str(path))
    runtime = load_runtime(str(path))
    worker = open_in_process(runtime, EngineConfig(max_batch=2, max_len=1024))
    try:
        async with running_gateway(worker) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                                          timeout=300) as oa, \
                    anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0,
                                             timeout=300) as an:
                yield runtime.name, oa, an, worker
    finally:
        await worker.aclose()


async def test_chat_reasoning_content_aggregate_and_stream(served):
    """`thinking_budget` (extra body): reasoning in `message.reasoning_content`, content after the
    forced close in `message.content`; the stream's `delta.reasoning_content` and `delta.content`
    concatenate to them; usage counts the reasoning tokens."""
    model, oa, _, _ = served
    ask = dict(model=model, messages=ASK, max_tokens=12, temperature=0,
               extra_body={"thinking_budget": 4})
    whole = await oa.chat.completions.create(**ask)
    message = whole.choices[0].message
    assert message.reasoning_content and message.content
    assert whole.usage.completion_tokens_details.reasoning_tokens in (5, 6)  # + "\n"? + </think>
    reasoning, content = "", ""
    async for chunk in await oa.chat.completions.create(stream=True, **ask):
        for choice in chunk.choices:
            reasoning += getattr(choice.delta, "reasoning_content", None) or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (message.reasoning_content, message.content)


async def test_chat_json_schema_with_thinking_and_thinking_off(served):
    """JSON Schema with thinking on: content schema-valid, reasoning apart; with
    `chat_template_kwargs.enable_thinking: false` there is no reasoning at all."""
    model, oa, _, _ = served
    fmt = {"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}}
    on = await oa.chat.completions.create(model=model, messages=ASK, max_tokens=64,
                                          temperature=0, response_format=fmt,
                                          extra_body={"thinking_budget": 3})
    off = await oa.chat.completions.create(
        model=model, messages=ASK, max_tokens=64, temperature=0, response_format=fmt,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert on.choices[0].message.reasoning_content
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    for reply in (on, off):
        choice = reply.choices[0]
        assert choice.message.content.startswith("{")
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), SCHEMA)


async def test_responses_reasoning_items_and_events(served):
    """Responses: a `reasoning` output item (its text in content[0]) before the message; the
    stream's `response.reasoning_text.delta` events concatenate to it and its
    `response.output_text.delta` events to the message text."""
    model, oa, _, _ = served
    ask = dict(model=model, input="Is the sky blue?", max_output_tokens=12, temperature=0,
               extra_body={"thinking_budget": 4})
    whole = await oa.responses.create(**ask)
    kinds = [item.type for item in whole.output]
    assert kinds == ["reasoning", "message"]
    reasoning = whole.output[0].content[0].text
    assert reasoning and whole.output_text
    assert whole.usage.output_tokens_details.reasoning_tokens in (5, 6)
    got = {"reasoning": "", "text": ""}
    types = []
    async for event in await oa.responses.create(stream=True, **ask):
        types.append(event.type)
        if event.type == "response.reasoning_text.delta":
            got["reasoning"] += event.delta
        elif event.type == "response.output_text.delta":
            got["text"] += event.delta
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert got == {"reasoning": reasoning, "text": whole.output_text}
    assert [i.type for i in final.output] == kinds
    assert types.index("response.reasoning_text.done") < types.index("response.output_text.delta")


async def test_responses_effort_none_turns_thinking_off(served):
    model, oa, _, _ = served
    whole = await oa.responses.create(model=model, input="Is the sky blue?", max_output_tokens=4,
                                      temperature=0, reasoning={"effort": "none"})
    assert [item.type for item in whole.output] == ["message"]


async def test_anthropic_thinking_blocks_and_deltas(served):
    """Anthropic `thinking: {type: enabled, budget_tokens}`: a `thinking` block first, then the
    text; the SDK's stream accumulator (thinking_delta, text_delta) rebuilds the same message;
    `thinking: {type: disabled}` gives no thinking block."""
    model, _, an, _ = served
    ask = dict(model=model, max_tokens=12, extra_body={"top_k": 1}, messages=ASK,
               thinking={"type": "enabled", "budget_tokens": 4})
    whole = await an.messages.create(**ask)
    assert [b.type for b in whole.content] == ["thinking", "text"]
    async with an.messages.stream(**ask) as stream:
        deltas = [e.delta.type async for e in stream if e.type == "content_block_delta"]
        final = await stream.get_final_message()
    assert {"thinking_delta", "text_delta"} <= set(deltas)
    assert [(b.type, getattr(b, "thinking", None), getattr(b, "text", None))
            for b in final.content] == \
        [(b.type, getattr(b, "thinking", None), getattr(b, "text", None)) for b in whole.content]
    off = await an.messages.create(model=model, max_tokens=4, messages=ASK,
                                   thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"]


async def test_anthropic_thinking_signatures_round_trip(served):
    """"thinking blocks carry no `signature` and no `signature_delta` (clients such as Claude
    Code need them round-tripped)": the block's signature, in the aggregate and as the stream's
    signature_delta (what the SDK accumulates), is accepted back with the block unchanged; the
    same signature over an edited text is a 400 naming it."""
    model, _, an, _ = served
    ask = dict(model=model, max_tokens=12, extra_body={"top_k": 1}, messages=ASK,
               thinking={"type": "enabled", "budget_tokens": 4})
    whole = await an.messages.create(**ask)
    thinking = whole.content[0]
    assert thinking.type == "thinking" and thinking.signature
    async with an.messages.stream(**ask) as stream:
        deltas = [e.delta.type async for e in stream if e.type == "content_block_delta"]
        final = await stream.get_final_message()
    assert deltas.count("signature_delta") == 1
    assert deltas.index("signature_delta") == len([d for d in deltas if d == "thinking_delta"])
    assert final.content[0].signature == thinking.signature
    history = ASK + [{"role": "assistant", "content": [b.model_dump() for b in whole.content]},
                     {"role": "user", "content": "Why?"}]
    again = await an.messages.create(**{**ask, "messages": history})
    assert again.content
    edited = [dict(b.model_dump()) for b in whole.content]
    edited[0]["thinking"] += " (edited)"
    with pytest.raises(anthropic.BadRequestError) as info:
        await an.messages.create(**{**ask, "messages": ASK + [
            {"role": "assistant", "content": edited}, {"role": "user", "content": "Why?"}]})
    assert info.value.body["error"]["param"] == "messages[1].content[0].signature"


async def test_history_reasoning_reaches_the_template(served):
    """An assistant turn's reasoning sent back (Chat `reasoning_content`, Anthropic `thinking`
    blocks) is the template's to render: the Qwen3.5 template shows it for the turns after the
    last user message, so the prompt grows by it there (counted by the gateway's count_tokens)."""
    model, _, an, worker = served
    turn = [{"role": "user", "content": "Weather?"}]
    plain = turn + [{"role": "assistant", "content": [{"type": "text", "text": "Sunny."}]}]
    thought = turn + [{"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Look outside first.", "signature": ""},
        {"type": "text", "text": "Sunny."}]}]
    counts = [(await an.messages.count_tokens(model=model, messages=m)).input_tokens
              for m in (plain, thought)]
    assert counts[1] > counts[0]


async def test_continued_final_message_publishes_only_the_suffix(served):
    """Chat `continue_final_message` and Anthropic's prefilled last assistant turn with a JSON
    Schema: the matcher starts from the prefix `{"ok":`, only the suffix is published, and
    prefix + suffix is the schema-valid whole (the constraint report judges the whole). The
    continuation starts in content: no reasoning."""
    model, oa, an, _ = served
    prefix = '{"ok":'
    chat = await oa.chat.completions.create(
        model=model, max_tokens=40, temperature=0,
        messages=ASK + [{"role": "assistant", "content": prefix}],
        response_format={"type": "json_schema", "json_schema": {"name": "ok", "schema": SCHEMA}},
        extra_body={"continue_final_message": True})
    message = await an.messages.create(
        model=model, max_tokens=40, messages=ASK + [{"role": "assistant", "content": prefix}],
        output_config={"format": {"type": "json_schema", "schema": SCHEMA}},
        extra_body={"top_k": 1})
    texts = [(chat.choices[0].message.content, chat.choices[0].finish_reason)]
    texts.append(("".join(b.text for b in message.content if b.type == "text"),
                  "stop" if message.stop_reason == "end_turn" else message.stop_reason))
    assert getattr(chat.choices[0].message, "reasoning_content", None) is None
    assert [b.type for b in message.content] == ["text"]
    assert any(finish == "stop" for _, finish in texts), texts
    for suffix, finish in texts:
        assert not suffix.startswith(prefix)
        if finish == "stop":
            jsonschema.validate(json.loads(prefix + suffix), SCHEMA)
    with pytest.raises(openai.BadRequestError) as info:
        await oa.chat.completions.create(model=model, messages=ASK, max_tokens=4,
                                         extra_body={"continue_final_message": True})
    assert info.value.param == "continue_final_message"


WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                            "days": {"type": "integer", "minimum": 1,
                                                     "maximum": 3}},
           "required": ["city", "days"], "additionalProperties": False}


async def test_chat_strict_xml_tool_call_streams_its_arguments(served):
    """A strict tool named by tool_choice, with thinking on: the reasoning comes first, then one
    call whose streamed `arguments` deltas concatenate to the aggregate's arguments, valid
    against the tool's schema (jsonschema)."""
    model, oa, _, _ = served
    ask = dict(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
               max_tokens=60, temperature=0, extra_body={"thinking_budget": 2},
               tools=[{"type": "function", "function": {"name": "weather", "parameters": WEATHER,
                                                        "strict": True}}],
               tool_choice={"type": "function", "function": {"name": "weather"}})
    whole = await oa.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.reasoning_content
    (call,) = choice.message.tool_calls
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    arguments, names = "", []
    async for chunk in await oa.chat.completions.create(stream=True, **ask):
        for delta in chunk.choices[0].delta.tool_calls or () if chunk.choices else ():
            names += [delta.function.name] if delta.function.name else []
            arguments += delta.function.arguments or ""
    assert (names, arguments) == (["weather"], call.function.arguments)


async def test_chat_logprobs_list_content_tokens_only(served):
    """Log-probabilities (docs/using-openai-chat.md): one entry per generated content token,
    never a reasoning token nor the forced thinking close (no distribution sampled it): their
    texts concatenate to the content, streamed and not alike, and they number at most the
    completion tokens less the reasoning ones (the forced close's separator is content-phase
    output no distribution sampled)."""
    model, oa, _, _ = served
    ask = dict(model=model, messages=ASK, max_tokens=12, temperature=0, logprobs=True,
               top_logprobs=2, extra_body={"thinking_budget": 4})
    whole = await oa.chat.completions.create(**ask)
    choice = whole.choices[0]
    entries = choice.logprobs.content
    assert choice.message.reasoning_content and entries
    assert "".join(e.token for e in entries) == choice.message.content
    usage = whole.usage
    end = 1 if choice.finish_reason == "stop" else 0
    assert len(entries) <= usage.completion_tokens - \
        usage.completion_tokens_details.reasoning_tokens - end
    streamed = []
    async for chunk in await oa.chat.completions.create(stream=True, **ask):
        for c in chunk.choices:
            streamed += c.logprobs.content if c.logprobs and c.logprobs.content else []
    assert [e.token for e in streamed] == [e.token for e in entries]
