"""Protocol details on the real embedded default (the built-in SmolLM2 on the CPU, a model
without a thinking mode) behind a real gateway, through the official `openai` and `anthropic`
SDKs and raw HTTP."""

from __future__ import annotations

import anthropic
import openai
import pytest

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
HI = [{"role": "user", "content": "Hi"}]


@pytest.mark.parametrize("extra, field", [
    ({"reasoning_effort": "low"}, "reasoning_effort"),
    ({"extra_body": {"thinking_budget": 64}}, "thinking_budget"),
    ({"extra_body": {"chat_template_kwargs": {"enable_thinking": True}}},
     "chat_template_kwargs.enable_thinking"),
], ids=["reasoning_effort", "thinking_budget", "enable_thinking"])
async def test_chat_reasoning_controls_on_a_model_without_thinking_are_refused(chat, extra, field):
    """"Nothing that changes the output may be silently ignored: a typed 400 naming the field"
    (reasoning controls on a model without thinking)."""
    with pytest.raises(openai.BadRequestError) as err:
        await chat.chat.completions.create(model="smollm2", messages=HI, max_tokens=2, **extra)
    body = err.value.body
    assert (body["param"], body["code"]) == (field, "unsupported"), body
    assert "thinking" in body["message"]


async def test_turning_thinking_off_on_a_model_without_it_is_a_no_op(chat):
    """`reasoning_effort: none` asks for what the model does anyway: nothing is ignored."""
    reply = await chat.chat.completions.create(model="smollm2", messages=HI, max_tokens=2,
                                               reasoning_effort="none")
    assert reply.choices[0].finish_reason in ("length", "stop")


async def test_responses_reasoning_effort_on_a_model_without_thinking_is_refused(chat):
    with pytest.raises(openai.BadRequestError) as err:
        await chat.responses.create(model="smollm2", input="Hi", max_output_tokens=2,
                                    reasoning={"effort": "low"})
    assert err.value.body["param"] == "reasoning.effort", err.value.body


async def test_anthropic_thinking_on_a_model_without_thinking_is_refused(claude):
    with pytest.raises(anthropic.BadRequestError) as err:
        await claude.messages.create(model="smollm2", max_tokens=20, messages=HI,
                                     thinking={"type": "enabled", "budget_tokens": 16})
    error = err.value.body["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "thinking", error


async def _message_usages(claude, messages) -> tuple[dict, dict]:
    """The usage of message_start and of message_delta of one streamed message."""
    start = delta = None
    async with claude.messages.stream(model="smollm2", max_tokens=3, messages=messages,
                                      extra_body={"temperature": 0}) as stream:
        async for event in stream:
            if event.type == "message_start":
                start = event.message.usage.model_dump()
            elif event.type == "message_delta":
                delta = event.usage.model_dump()
    return start, delta


async def test_message_start_usage_is_written_after_the_prefix_cache_lookup(claude):
    """"message_start.usage is written before the prefix-cache lookup (input 43 / cache_read 0,
    then message_delta says 11 / 32)": the start now says what the end says."""
    text = ("A long note about rivers, so that the prompt spans several KV blocks of sixteen "
            "tokens: rivers carry water from mountains to the sea, shape valleys, and feed "
            "farms along their banks. Which river is the longest?")
    messages = [{"role": "user", "content": text}]
    await _message_usages(claude, messages)  # fills the prefix cache
    start, delta = await _message_usages(claude, messages)
    assert start["cache_read_input_tokens"] > 0, start
    assert (start["input_tokens"], start["cache_read_input_tokens"]) == \
        (delta["input_tokens"], delta["cache_read_input_tokens"])


async def test_anthropic_sdk_user_profile_and_workspace_are_accepted(claude):
    """The anthropic SDK's `user_profile_id` and `workspace_id` travel as the headers
    `anthropic-user-profile-id` and `anthropic-workspace-id` (attribution of the request, nothing
    that changes the output): accepted, on messages and on count_tokens."""
    ids = dict(user_profile_id="uprof_1", workspace_id="wrkspc_1")
    message = await claude.messages.create(model="smollm2", max_tokens=2, messages=HI, **ids)
    assert message.stop_reason in ("max_tokens", "end_turn")
    count = await claude.messages.count_tokens(model="smollm2", messages=HI, **ids)
    assert count.input_tokens > 0
