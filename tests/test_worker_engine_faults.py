"""A failure inside one request's finishing stays that request's failure.

Issue 12: "no stage's failure becomes everyone's failure". Found by the load test under faults
(tests/test_loadtest_faults.py): a tool-call decoder error at the end of one truncated request
escaped `finish`, the engine thread's own failure handler hit it again and the thread ended, so
every request resident on that worker hung and every later one got 500 "the engine is not
running".
"""

from __future__ import annotations

import pytest

from shared.contract import ToolChoice, ToolDefinition
from shared.frontends.formats import hermes
from shared.generation import ChatMessage, FinishReason, GenerateRequest, PromptInput
from tests.worker_support import collect, greedy, open_client, text_request, tiny_runtime


@pytest.mark.asyncio
async def test_a_tool_decoder_bug_fails_its_request_and_the_engine_keeps_serving(monkeypatch):
    runtime = tiny_runtime()

    def broken(self, *, complete):
        raise IndexError("pop from empty list")

    monkeypatch.setattr(hermes.ToolStream, "finish", broken)
    tools = (ToolDefinition.create("ping", {"type": "object"}),)
    client = open_client(runtime, max_batch=2, max_len=1024)
    try:
        request = GenerateRequest("tools", PromptInput(messages=(ChatMessage("user", "hi"),),
                                                       tools=tools),
                                  greedy(4, tool_choice=ToolChoice()), model=runtime.name)
        _, failed = await collect(client, request)
        assert failed.finish_reason is FinishReason.ERROR
        assert failed.error["type"] == "InternalError" and "IndexError" in failed.error["message"]
        _, after = await collect(client, text_request("after", "hello", greedy(3), runtime.name))
        assert after.finish_reason is FinishReason.LENGTH and after.error is None
        assert client.engine.health()["status"] == "ok"
    finally:
        await client.aclose()
