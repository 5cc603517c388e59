"""Gateway service behaviour: API keys, limits, completions, models, health, metrics, logs."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import anthropic
import openai
import pytest
import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from services.gateway import GatewayLimits
from shared.contract import ConstraintKind
from tests.support.fake_worker import FakeWorker, Script, running_gateway

MODEL = "smollm2"
USER = [{"role": "user", "content": "hi"}]


@pytest.mark.asyncio
async def test_api_keys():
    """When api_keys is set, OpenAI and Anthropic routes need a valid key (either header) and
    refuse others with 401 in the protocol's error shape; /healthz stays open."""
    worker = FakeWorker()
    async with running_gateway(worker, api_keys=frozenset({"sekret"})) as url:
        async with (
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0) as bad,
            anthropic.AsyncAnthropic(base_url=url, api_key="wrong", max_retries=0) as abad,
            anthropic.AsyncAnthropic(base_url=url, api_key="sekret", max_retries=0) as agood,
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="sekret", max_retries=0) as good,
        ):
            with pytest.raises(openai.AuthenticationError) as info:
                await bad.chat.completions.create(model=MODEL, messages=USER)
            assert info.value.body["type"] == "authentication_error"
            with pytest.raises(anthropic.AuthenticationError) as ainfo:
                await abad.messages.create(model=MODEL, max_tokens=4, messages=USER)
            assert ainfo.value.body == {"type": "error", "error": {
                "type": "authentication_error", "message": ainfo.value.body["error"]["message"]}}
            assert worker.requests == []
            await good.chat.completions.create(model=MODEL, messages=USER)
            await agood.messages.create(model=MODEL, max_tokens=4, messages=USER)
            # x-api-key on an OpenAI route is accepted too.
            await bad.chat.completions.create(
                model=MODEL,
                messages=USER,
                extra_headers={"Authorization": "", "x-api-key": "sekret"},
            )
            assert len(worker.requests) == 3
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as r:
                assert r.status == 200 and (await r.json())["status"] == "ok"
            async with http.get(url + "/metrics") as r:
                assert r.status == 401


@pytest.mark.asyncio
async def test_limits():
    """GatewayLimits: body bytes (413), messages, tools and schema bytes (400 naming the limit)."""
    limits = GatewayLimits(max_body_bytes=4096, max_messages=2, max_tools=1, max_schema_bytes=64)
    worker = FakeWorker()
    async with running_gateway(worker, limits=limits) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            with pytest.raises(openai.APIStatusError) as info:
                await client.chat.completions.create(model=MODEL, messages=[
                    {"role": "user", "content": "x" * 5000}])
            assert info.value.status_code == 413
            assert "max_body_bytes=4096" in info.value.message
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model=MODEL, messages=USER * 3)
            assert info.value.param == "messages" and "max_messages=2" in info.value.message
            tool = {"type": "function", "function": {"name": "a", "parameters": {}}}
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model=MODEL, messages=USER, tools=[tool, tool])
            assert info.value.param == "tools" and "max_tools=1" in info.value.message
            schema = {
                "type": "object",
                "properties": {f"p{i}": {"type": "string"} for i in range(5)},
            }
            assert len(json.dumps(schema, separators=(",", ":"))) > 64
            with pytest.raises(openai.BadRequestError) as info:
                await client.chat.completions.create(model=MODEL, messages=USER, response_format={
                    "type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
            assert info.value.param == "response_format.json_schema.schema"
            assert "max_schema_bytes=64" in info.value.message
    assert worker.requests == []


@pytest.mark.asyncio
async def test_completions_and_models():
    """"POST /v1/completions | raw text continuation; a direct grammar applies to all new
    text"; streamed text deltas concatenate to the aggregate text."""
    worker = FakeWorker(Script(text=("4", "2")), served=("smollm2", "qwen3.5"))
    async with running_gateway(worker) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            models = await client.models.list()
            assert [m.id for m in models.data] == ["smollm2", "qwen3.5"]
            whole = await client.completions.create(
                model=MODEL, prompt="6*7=", max_tokens=4, temperature=0, seed=3, stop="\n",
                extra_body={"structured_outputs": {"regex": "[0-9]+"}})
            req = worker.last
            assert req.prompt.text == "6*7=" and req.prompt.messages is None
            assert req.options.constraint.kind is ConstraintKind.REGEX
            assert (req.options.max_tokens, req.options.sampling.temperature,
                    req.options.sampling.seed, req.options.stop) == (4, 0.0, 3, ("\n",))
            assert whole.choices[0].text == "42" and whole.id.startswith("cmpl-")
            chunks = [c async for c in await client.completions.create(
                model=MODEL, prompt="6*7=", stream=True, stream_options={"include_usage": True})]
            assert "".join(c.choices[0].text for c in chunks if c.choices) == "42"
            assert chunks[-1].usage.total_tokens == 12
            with pytest.raises(openai.BadRequestError) as info:
                await client.completions.create(model=MODEL, prompt="x", n=0)
            assert info.value.param == "n"


@pytest.mark.asyncio
async def test_request_done_log_and_metrics():
    """"structlog JSON logs (one request_done line per request with the constraint report),
    Prometheus metrics ... with fixed-enum labels only (never grammar or schema text)"."""
    report = {"branch": "content", "complete": True, "terminated": True, "cache": "built"}
    worker = FakeWorker(Script(text=('{"secret_output":1}',), constraint=report))
    registry = CollectorRegistry()
    secret_schema = {"type": "object", "properties": {"secret_field": {"type": "integer"}}}
    async with running_gateway(worker, registry=registry) as url:
        async with openai.AsyncOpenAI(base_url=url + "/v1", api_key="k", max_retries=0) as client:
            with structlog.testing.capture_logs() as logs:
                await client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "secret prompt"}],
                    response_format={"type": "json_schema",
                                     "json_schema": {"name": "s", "schema": secret_schema}})
                with pytest.raises(openai.BadRequestError):
                    await client.chat.completions.create(model=MODEL, messages=USER, n=0)
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/metrics") as r:
                exposition = await r.text()
    done = [e for e in logs if e["event"] == "request_done"]
    assert len(done) == 2
    ok, rejected = done
    assert ok["request_id"] == worker.requests[0].request_id and ok["protocol"] == "chat"
    assert (ok["finish_reason"], ok["prompt_tokens"], ok["completion_tokens"]) == ("stop", 7, 5)
    assert ok["constraint"] == report and ok["constraint_kind"] == "json_schema"
    assert ok["total_s"] >= ok["ttft_s"] >= 0
    assert (rejected["status"], rejected["error_param"], rejected["outcome"]) == (
        400,
        "n",
        "rejected",
    )
    text = json.dumps(done, default=str)
    for secret in ("secret prompt", "secret_field", "secret_output"):
        assert secret not in text and secret not in exposition
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in text_string_to_metric_families(exposition) for s in fam.samples}
    key = ("infernix_gateway_requests_total",
           (("constraint", "json_schema"), ("outcome", "stop"), ("protocol", "chat")))
    assert samples[key] == 1
    assert samples[("infernix_gateway_requests_total",
                    (("constraint", "none"), ("outcome", "rejected"), ("protocol", "chat")))] == 1
    assert (
        samples[("infernix_gateway_tokens_total", (("kind", "completion"), ("protocol", "chat")))]
        == 5
    )


@pytest.mark.asyncio
async def test_health_reports_an_unreachable_worker():
    """/healthz reflects the worker's health: 503 when the worker cannot answer."""
    worker = FakeWorker(healthy=False)
    async with running_gateway(worker) as url:
        async with aiohttp.ClientSession() as http:
            async with http.get(url + "/healthz") as r:
                assert r.status == 503


@pytest.mark.asyncio
async def test_client_disconnect_cancels_the_generation():
    """"one object owns each deadline and cancels what it started": a client that goes away
    mid-stream gets its generation cancelled at the worker."""
    worker = FakeWorker(Script(text=tuple("abcdefghijklmnopqrst"), delay_s=0.05))
    async with running_gateway(worker) as url:
        async with aiohttp.ClientSession() as http:
            async with http.post(url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": USER, "stream": True}) as r:
                assert r.status == 200
                await r.content.readline()  # the role chunk
        for _ in range(100):
            if worker.cancelled:
                break
            await asyncio.sleep(0.02)
    assert worker.cancelled == [worker.last.request_id]
