"""Several choices with the real embedded worker (the built-in SmolLM2 on the CPU) behind a real
gateway: constrained choices are each valid (checked with `jsonschema`, an independent
validator), and choice seeds are derived deterministically, so a stream of n=2 repeats the first
two choices of an aggregate n=3 with the same seed. The gateway is the session's embedded default
(`gateway_url`, tests/gateway/conftest.py)."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
import pytest_asyncio

pytestmark = pytest.mark.asyncio(loop_scope="module")
SCHEMA = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
          "required": ["colour"], "additionalProperties": False}
ASK = dict(model="smollm2", seed=5, temperature=0.8, max_tokens=40,
           messages=[{"role": "user", "content": "Pick a colour, as JSON."}],
           response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": SCHEMA}})


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def client(gateway_url):
    async with openai.AsyncOpenAI(base_url=gateway_url + "/v1", api_key="k", max_retries=0) as sdk:
        yield sdk


async def test_constrained_choices_are_each_valid_and_reproducible(client):
    """Issue 11 §3: "n > 1 (independent choices, seeds derived per choice; constrained choices
    each valid)": every choice that ends normally is an instance of the schema; the same seed
    gives the same choices again, streamed."""
    whole = await client.chat.completions.create(n=3, **ASK)
    assert [c.index for c in whole.choices] == [0, 1, 2]
    finished = [c for c in whole.choices if c.finish_reason == "stop"]
    assert finished, "no choice ended within 40 tokens"
    for choice in finished:
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert whole.usage.completion_tokens >= len(whole.choices)
    stream = await client.chat.completions.create(n=2, stream=True, **ASK)
    texts = {0: "", 1: ""}
    async for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices[:2]]


async def test_prefix_cache_hits_appear_in_each_protocols_usage(client, gateway_url):
    """Issue 13: "cached prompt tokens (OpenAI `usage.prompt_tokens_details.cached_tokens`,
    Anthropic `usage.cache_read_input_tokens`)", and Responses' input_tokens_details: the same
    conversation asked again finds its full KV blocks (16 tokens each) in the worker's prefix
    cache, all but the last prompt token's block at most."""
    import anthropic

    text = ("Here is a short document about foxes. Foxes are small omnivorous mammals of the dog "
            "family, with a pointed snout and a bushy tail. Question: what colour are foxes?")
    messages = [{"role": "user", "content": text}]
    cold = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=2,
                                                temperature=0.0)
    hit = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=2,
                                               temperature=0.0)
    # the first ask may find only the template's system header, cached by the test above
    assert (
        cold.usage.prompt_tokens_details.cached_tokens
        < hit.usage.prompt_tokens_details.cached_tokens
    )
    assert (
        hit.usage.prompt_tokens_details.cached_tokens
        == (hit.usage.prompt_tokens - 1) // 16 * 16
        > 0
    )
    assert hit.choices[0].message.content == cold.choices[0].message.content
    reply = await client.responses.create(
        model="smollm2", input=text, max_output_tokens=2, temperature=0.0
    )
    assert reply.usage.input_tokens_details.cached_tokens > 0
    async with anthropic.AsyncAnthropic(base_url=gateway_url, api_key="k", max_retries=0) as sdk:
        message = await sdk.messages.create(model="smollm2", messages=messages, max_tokens=2)
    assert message.usage.cache_read_input_tokens > 0
    assert (
        message.usage.input_tokens + message.usage.cache_read_input_tokens
        == hit.usage.prompt_tokens
    )
