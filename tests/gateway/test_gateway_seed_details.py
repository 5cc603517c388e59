"""Seed details of the HTTP surface: a request that fails while generating keeps what it had
committed, in the non-streamed reply as in the stream; `/v1/completions` continues raw token-id
prompts (with or without a constraint) and names an id outside the vocabulary."""

from __future__ import annotations

import re

import anthropic
import openai
import pytest

from tests.support.fake_worker import FakeWorker, GatewayThread, InProcessGateway, Script

DEAD_END = {"type": "ConstraintDeadEnd", "message": "no legal token", "position": 3}


@pytest.fixture(scope="module")
def gateway():
    with GatewayThread(FakeWorker()) as gw:
        yield gw


@pytest.fixture
def sdks(gateway):
    """Both SDKs' clients on the scripted gateway, closed after the test (an unclosed client's
    socket would be collected, and warned about, in some later test)."""
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key="k", max_retries=0) as client, \
            anthropic.Anthropic(base_url=gateway.url, api_key="k", max_retries=0) as messages:
        yield client, messages


def test_a_dead_end_while_generating_keeps_the_committed_output(gateway, sdks):
    """Seed: when a row reaches a dead end "none of that uncommitted result is published;
    earlier committed output is kept" -- a stream has published it before its error event, so
    the non-streamed 422 carries the same committed content (chat, completions, Messages)."""
    gateway.worker.reset(Script(text=("The ", "answer"), reasoning=("hm",), error=DEAD_END))
    client, messages = sdks
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
    with pytest.raises(anthropic.UnprocessableEntityError) as info:
        messages.messages.create(model="smollm2", max_tokens=10, messages=user)
    assert info.value.body["error"]["committed"]["content"] == streamed


def test_an_error_before_generation_carries_no_committed_output(gateway, sdks):
    """Only a failure found while generating has committed output; a 400 has none."""
    gateway.worker.reset(Script(text=("x",)))
    client, _ = sdks
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="smollm2", messages=[], max_tokens=1)
    assert "committed" not in info.value.body


def _open_tiny():
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from tests.support.tiny_worker import tiny_smollm2_runtime

    return open_in_process(tiny_smollm2_runtime(), EngineConfig(max_batch=2, max_len=256))


@pytest.fixture(scope="module")
def tiny():
    """A real engine (random 2-layer weights over the SmolLM2 vocabulary and tokenizer)."""
    with InProcessGateway(_open_tiny) as gw, \
            openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0) as client:
        yield client


def test_token_id_prompts_continue_as_their_text_does(tiny):
    """Seed / OpenAI Completions: `prompt` may be token ids or a list of token-id lists; raw ids
    are continued as they are, so greedy decoding of a text's own ids gives what the text gives,
    and a grammar constrains what follows them."""
    from shared.frontends import get_frontend

    text = "The capital of France is"
    ids = list(get_frontend("smollm2").tokenizer.encode(text))
    ask = dict(model="smollm2", max_tokens=6, temperature=0)
    by_text = tiny.completions.create(prompt=text, **ask)
    by_ids = tiny.completions.create(prompt=ids, **ask)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.usage.prompt_tokens == len(ids) == by_text.usage.prompt_tokens
    batch = tiny.completions.create(prompt=[ids, ids[:3]], extra_body={"structured_outputs": {
        "regex": "[0-9]{1,4}"}}, **ask)
    assert len(batch.choices) == 2
    for choice in batch.choices:
        assert re.fullmatch("[0-9]{1,4}", choice.text), choice.text
    assert batch.usage.prompt_tokens == len(ids) + 3


@pytest.mark.parametrize("prompt, param", [
    ([1, 10 ** 9], "prompt[1]"), ([5, -1], "prompt[1]"), ([[1], [2, 3, 49152]], "prompt[1][2]"),
    ([1, "a"], "prompt[1]"), ([[1], []], "prompt[1]"), ([[1, 2.5]], "prompt[0][1]"),
])
def test_a_bad_token_id_is_a_400_naming_it(tiny, prompt, param):
    """Bad client input is a typed error naming the field: an id outside the vocabulary
    (SmolLM2 has 49,152 tokens) or not an integer is a 400 naming its `prompt[i]`."""
    with pytest.raises(openai.BadRequestError) as info:
        tiny.completions.create(model="smollm2", prompt=prompt, max_tokens=2)
    assert info.value.body["param"] == param, info.value.body


def test_token_id_prompts_survive_the_worker_protocol():
    """The compose deployment's route (gateway -> gRPC -> worker) carries a token-id prompt as
    ids, with the place in the body its errors name; an id outside int64 is refused there, named,
    never sent as something else."""
    from shared.errors import InvalidRequest
    from shared.generation import PromptInput
    from shared.proto.generation_codec import prompt_from_proto, prompt_to_proto

    prompt = PromptInput(token_ids=(1, 2, 49151), source="prompt[2]")
    assert prompt_from_proto(prompt_to_proto(prompt)) == prompt
    with pytest.raises(InvalidRequest) as info:
        prompt_to_proto(PromptInput(token_ids=(1, 2 ** 63), source="prompt[2]"))
    assert info.value.field == "prompt[2][1]"


@pytest.mark.asyncio
async def test_token_id_prompts_over_grpc_continue_as_in_process():
    """Seed: raw token-id prompts (optionally with a grammar) are served; over the worker's gRPC
    service they give what the in-process worker gives, and an id outside the vocabulary is the
    worker's typed 400 naming `prompt[i]`."""
    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.remote import GrpcWorkerClient
    from services.worker.service import create_server
    from shared.contract import OutputConstraint
    from shared.errors import InvalidRequest
    from shared.frontends import get_frontend
    from shared.generation import (
        Finished,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )
    from tests.conftest import free_port
    from tests.support.tiny_worker import tiny_smollm2_runtime

    ids = tuple(get_frontend("smollm2").tokenizer.encode("The capital of France is"))

    def request(rid, prompt_ids, constraint=None):
        return GenerateRequest(rid, PromptInput(token_ids=prompt_ids), RequestOptions(
            max_tokens=6, sampling=SamplingParams(temperature=0), constraint=constraint),
            model="smollm2")

    async def finished(worker, req):
        return [e async for e in worker.generate(req) if isinstance(e, Finished)][-1]

    worker = open_in_process(tiny_smollm2_runtime(), EngineConfig(max_batch=1, max_len=256))
    server = create_server(worker)
    port = free_port()
    await server.start("127.0.0.1", port)
    client = GrpcWorkerClient("127.0.0.1", port)
    try:
        digits = OutputConstraint.regex("[0-9]{1,4}")
        for constraint in (None, digits):
            want = await finished(worker, request("local", ids, constraint))
            got = await finished(client, request("remote", ids, constraint))
            assert got.content == want.content and got.usage == want.usage
        assert re.fullmatch("[0-9]{1,4}", got.content), got.content
        with pytest.raises(InvalidRequest) as info:
            await finished(client, request("bad", (1, 49152)))
        assert info.value.field == "prompt[1]"
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()
        await worker.aclose()
