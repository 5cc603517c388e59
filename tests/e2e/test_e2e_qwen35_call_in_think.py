"""Qwen3.5 as it really behaves: it often opens `<tool_call>` inside `<think>` without closing
the reasoning first (vLLM treats `<tool_call>` as an implicit end of reasoning). A tiny
random-weight Qwen3.5 checkpoint with the real vocabulary and chat template, steered to open a
call after a few reasoning tokens, behind a real gateway and the official `openai` SDK: the tool
grammar accepts the call there, and the reply publishes the reasoning up to the call, then the
call, in the aggregate as in the stream."""

from __future__ import annotations

import json

import openai
import pytest
import pytest_asyncio

from tests.support.fake_worker import running_gateway
from tests.support.qwen35_support import hf_causal_lm
from tests.support.worker_support import hooked

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.slow]
REASONING_TOKENS = 6  # generated before the steering opens the call
PING = {"type": "function", "function": {"name": "ping", "strict": True, "parameters": {
    "type": "object", "properties": {}, "additionalProperties": False}}}


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def served(tmp_path_factory):
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    path = tmp_path_factory.mktemp("qwen35-call-in-think")
    hf_causal_lm(seed=5, max_position_embeddings=1024).save_pretrained(str(path))
    runtime, model = hooked(load_runtime(str(path)))
    domain = runtime.domain
    opener, close = domain.special_id("<tool_call>"), domain.special_id("</think>")
    first: dict[int, int] = {}  # lane -> decode steps run (each samples one more token)

    def after(logits, positions, lanes):
        for row, lane in enumerate(lanes.tolist()):
            steps = first.get(lane, -1) + 1 if positions.shape[-1] == 1 else first.get(lane, 0)
            first[lane] = steps  # the prompt's (last) prefill samples the first token
            logits[row, ..., close] -= 100.0  # never the explicit close
            if steps >= REASONING_TOKENS:
                logits[row, ..., opener] += 100.0  # the mask decides whether it is legal

    model.after = after
    worker = open_in_process(runtime, EngineConfig(max_batch=1, max_len=1024))
    try:
        async with running_gateway(worker) as url:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0,
                                          timeout=300) as oa:
                yield runtime.name, oa, first
    finally:
        await worker.aclose()


async def test_a_call_opened_inside_think_ends_the_reasoning(served):
    """The reasoning is published up to the call, then the call; no content; the stream agrees
    with the aggregate."""
    model, oa, first = served
    ask = dict(model=model, messages=[{"role": "user", "content": "Ping it."}], tools=[PING],
               tool_choice="auto", parallel_tool_calls=False, max_tokens=40, temperature=0)
    first.clear()
    whole = await oa.chat.completions.create(**ask)
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    message = choice.message
    assert message.reasoning_content and not message.content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == \
        [("ping", {})]
    assert "<tool_call>" not in message.reasoning_content
    first.clear()
    reasoning, content, calls = "", "", []
    async for chunk in await oa.chat.completions.create(stream=True, **ask):
        for delta in (c.delta for c in chunk.choices):
            reasoning += getattr(delta, "reasoning_content", None) or ""
            content += delta.content or ""
            calls += [t.function.name for t in delta.tool_calls or () if t.function.name]
    assert (reasoning, content, calls) == (message.reasoning_content, "", ["ping"])
