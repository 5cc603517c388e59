"""Thinking fields in and reasoning out, for all three protocols, against a scripted worker and the
official SDKs (issue 9 §2): what each protocol's thinking switches, budgets and history reasoning
become in the worker contract, and how a worker's reasoning deltas are published."""

from __future__ import annotations

import anthropic
import openai
import pytest
import pytest_asyncio

from services.gateway.translate import EFFORT_BUDGETS
from tests.support.fake_worker import FakeWorker, Script, running_gateway

pytestmark = pytest.mark.asyncio(loop_scope="module")
MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]
THOUGHT = Script(reasoning=("Let me ", "think."), text=("Yes", "."))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served():
    worker = FakeWorker()
    async with running_gateway(worker) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as oa, \
                anthropic.AsyncAnthropic(base_url=url, api_key="k", max_retries=0) as an:
            yield worker, oa, an


@pytest_asyncio.fixture(loop_scope="module")
async def gw(served):
    served[0].reset(THOUGHT)
    return served


def thinking(worker: FakeWorker) -> tuple:
    last = worker.last
    return last.prompt.enable_thinking, last.options.thinking_budget


async def test_chat_fields_map_to_thinking_settings(gw):
    """`chat_template_kwargs.enable_thinking` (vLLM / SGLang), `thinking_budget` (Infernix),
    `reasoning_effort` (a documented budget; "none" = off); `reasoning_content` of an assistant
    turn goes to the template; `continue_final_message` continues the last assistant turn."""
    worker, oa, _ = gw
    cases = [({}, (None, None)),
             ({"chat_template_kwargs": {"enable_thinking": False}}, (False, None)),
             ({"thinking_budget": 7}, (None, 7)),
             ({"reasoning_effort": "low"}, (True, EFFORT_BUDGETS["low"])),
             ({"reasoning_effort": "none"}, (False, None))]
    for extra, expected in cases:
        await oa.chat.completions.create(model=MODEL, messages=USER, extra_body=extra)
        assert thinking(worker) == expected, extra
    history = USER + [{"role": "assistant", "content": "Hello", "reasoning_content": "Greet."}]
    await oa.chat.completions.create(model=MODEL, messages=history,
                                     extra_body={"continue_final_message": True})
    last = worker.last.prompt
    assert last.continue_final_assistant and last.messages[-1].reasoning == "Greet."


@pytest.mark.parametrize("extra, param", [
    ({"thinking_budget": -1}, "thinking_budget"),
    ({"thinking_budget": 5, "reasoning_effort": "low"}, "thinking_budget"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
    ({"chat_template_kwargs": {"enable_thinking": True}, "reasoning_effort": "none"},
     "chat_template_kwargs.enable_thinking"),
    ({"chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs.enable_thinking"),
])
async def test_chat_thinking_errors_name_the_field(gw, extra, param):
    worker, oa, _ = gw
    with pytest.raises(openai.BadRequestError) as info:
        await oa.chat.completions.create(model=MODEL, messages=USER, extra_body=extra)
    assert info.value.param == param
    assert worker.requests == []


async def test_chat_publishes_reasoning_content(gw):
    worker, oa, _ = gw
    whole = await oa.chat.completions.create(model=MODEL, messages=USER)
    assert (whole.choices[0].message.reasoning_content, whole.choices[0].message.content) == \
        ("Let me think.", "Yes.")
    chunks = [c async for c in await oa.chat.completions.create(model=MODEL, messages=USER,
                                                                 stream=True)]
    deltas = [(getattr(c.choices[0].delta, "reasoning_content", None), c.choices[0].delta.content)
              for c in chunks if c.choices]
    assert [r for r, _ in deltas if r] == ["Let me ", "think."]
    assert "".join(t for _, t in deltas if t) == "Yes."


async def test_responses_fields_and_reasoning_items(gw):
    """`reasoning.effort` maps to a documented budget; a `reasoning` input item becomes the next
    assistant turn's reasoning; the output has a reasoning item before the message."""
    worker, oa, _ = gw
    reply = await oa.responses.create(model=MODEL, input=[
        {"role": "user", "content": "hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Greet."}]},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "again"}], reasoning={"effort": "medium"})
    assert thinking(worker) == (True, EFFORT_BUDGETS["medium"])
    messages = worker.last.prompt.messages
    assert [(m.role, m.content, m.reasoning) for m in messages] == [
        ("user", "hi", None), ("assistant", "Hello", "Greet."), ("user", "again", None)]
    assert [i.type for i in reply.output] == ["reasoning", "message"]
    assert reply.output[0].content[0].text == "Let me think." and reply.output_text == "Yes."
    await oa.responses.create(model=MODEL, input="hi", extra_body={"thinking_budget": 3})
    assert thinking(worker) == (None, 3)


async def test_anthropic_thinking_config_blocks_and_history(gw):
    worker, _, an = gw
    reply = await an.messages.create(model=MODEL, max_tokens=50, messages=USER + [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "Greet.",
                                           "signature": ""},
                                          {"type": "text", "text": "Hello"}]},
        {"role": "user", "content": "again"}],
        thinking={"type": "enabled", "budget_tokens": 9})
    assert thinking(worker) == (True, 9)
    assert worker.last.prompt.messages[1].reasoning == "Greet."
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in reply.content] == [("thinking", "Let me think."), ("text", "Yes.")]
    await an.messages.create(model=MODEL, max_tokens=5, messages=USER,
                             thinking={"type": "disabled"})
    assert thinking(worker) == (False, None)
    async with an.messages.stream(model=MODEL, max_tokens=5, messages=USER) as stream:
        kinds = [e.delta.type async for e in stream if e.type == "content_block_delta"]
    assert kinds == [
        "thinking_delta",
        "thinking_delta",
        "signature_delta",
        "text_delta",
        "text_delta",
    ]
    with pytest.raises(anthropic.BadRequestError):
        await an.messages.create(model=MODEL, max_tokens=5, messages=USER,
                                 thinking={"type": "enabled"})
