"""Seed details of the HTTP surface: a request that fails while generating keeps what it had
committed, in the non-streamed reply as in the stream."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.fake_worker import FakeWorker, GatewayThread, Script

DEAD_END = {"type": "ConstraintDeadEnd", "message": "no legal token", "position": 3}


@pytest.fixture(scope="module")
def gateway():
    with GatewayThread(FakeWorker()) as gw:
        yield gw


def test_a_dead_end_while_generating_keeps_the_committed_output(gateway):
    """Seed: when a row reaches a dead end "none of that uncommitted result is published;
    earlier committed output is kept" -- a stream has published it before its error event, so
    the non-streamed 422 carries the same committed content (chat, completions, Messages)."""
    gateway.worker.reset(Script(text=("The ", "answer"), reasoning=("hm",), error=DEAD_END))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)
    user = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="smollm2", messages=user)
    body = info.value.body
    assert body["code"] == "constraint_dead_end"
    streamed = ""
    with pytest.raises(openai.APIError):
        for chunk in client.chat.completions.create(model="smollm2", messages=user, stream=True):
            streamed += "".join(c.delta.content or "" for c in chunk.choices)
    assert streamed == "The answer"
    assert body["committed"] == {"index": 0, "content": streamed, "reasoning": "hm",
                                 "tool_calls": [], "output_tokens": 5}
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.completions.create(model="smollm2", prompt="x", n=2)
    assert info.value.body["committed"]["content"] == streamed
    assert info.value.body["committed"]["index"] == 0
    messages = anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0)
    with pytest.raises(anthropic.UnprocessableEntityError) as info:
        messages.messages.create(model="smollm2", max_tokens=10, messages=user)
    assert info.value.body["error"]["committed"]["content"] == streamed


def test_an_error_before_generation_carries_no_committed_output(gateway):
    """Only a failure found while generating has committed output; a 400 has none."""
    gateway.worker.reset(Script(text=("x",)))
    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smollm2", messages=[], max_tokens=1)
    assert "committed" not in info.value.body
