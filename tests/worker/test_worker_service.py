"""The worker gRPC service and GrpcWorkerClient over real loopback gRPC, wrapping FakeWorker."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
import pytest_asyncio
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from services.worker.remote import GrpcWorkerClient, WorkerUnavailable
from services.worker.service import create_server, serve
from shared.contract import (
    OutputConstraint,
    ToolChoice,
    ToolConstraints,
    ToolDefinition,
    ToolMode,
)
from shared.errors import (
    ConflictingConstraint,
    InternalError,
    InvalidRequest,
    InvalidSchema,
    SchemaSource,
)
from shared.generation import (
    ChatMessage,
    Finished,
    FinishReason,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
    Started,
    TextDelta,
    ToolCall,
    Usage,
)
from shared.proto.errors import ErrorStatusCodec, typed_error
from shared.proto.generation_codec import request_to_proto
from shared.proto.worker_grpc import WorkerStub
from tests.conftest import free_port
from tests.support.fake_worker import FakeWorker, Script, ScriptedCall


@pytest_asyncio.fixture
async def remote():
    """(FakeWorker, GrpcWorkerClient, server) on a free loopback port."""
    fake = FakeWorker(served=("smollm2", "qwen3.5"))
    server = create_server(fake)
    port = free_port()
    await server.start("127.0.0.1", port)
    client = GrpcWorkerClient("127.0.0.1", port)
    try:
        yield fake, client, server
    finally:
        await client.aclose()
        server.close()
        await server.wait_closed()


def rich_request() -> GenerateRequest:
    weather = ToolDefinition.create(
        "get_weather", {"type": "object", "properties": {"city": {"type": "string"}},
                        "required": ["city"]}, description="Weather for a city", strict=True)
    search = ToolDefinition.create("search.web", {"type": "object", "properties": {}})
    messages = (
        ChatMessage("system", "Be brief. ünïcødé ✓"),
        ChatMessage("user", "Weather in Paris?", name="alice"),
        ChatMessage("assistant", None, tool_calls=(
            ToolCall("call_1", "get_weather", '{"city":"Paris"}'),
            ToolCall("call_2", "search.web", "{}")), reasoning="Paris first.\n"),
        ChatMessage("tool", '{"temp":21}', tool_call_id="call_1"),
        ChatMessage("assistant", ""),
    )
    options = RequestOptions(
        max_tokens=77,
        sampling=SamplingParams(temperature=0.7, top_p=0.9, top_k=40, min_p=0.05, seed=-(2**63),
                                presence_penalty=0.5, frequency_penalty=-1.25,
                                repetition_penalty=1.1),
        constraint=OutputConstraint.json_schema({"type": "object", "properties": {
            "b": {"type": "integer"}, "a": {"enum": ["x", "y"]}}}),
        tool_choice=ToolChoice(ToolMode.REQUIRED, ("get_weather",), False,
                               ToolConstraints.AUTOMATIC),
        stop=("\n\n", "END"), stop_token_ids=(2, 2**40), timeout_s=12.5, thinking_budget=0)
    return GenerateRequest("req-rich", PromptInput(messages, tools=(weather, search),
                                                   continue_final_assistant=True,
                                                   enable_thinking=False),
                           options, model="qwen3.5")


def text_request() -> GenerateRequest:
    return GenerateRequest("req-text", PromptInput(text=""), RequestOptions(
        constraint=OutputConstraint.choice(["yes", "no", "maybe"]),
        tool_choice=ToolChoice(allowed_names=()), sampling=SamplingParams(temperature=0.0, seed=0)))


def regex_request() -> GenerateRequest:
    return GenerateRequest("req-regex", PromptInput(messages=()), RequestOptions(
        constraint=OutputConstraint.regex(r"[a-z]+\d{2}")))


@pytest.mark.asyncio
@pytest.mark.parametrize("make", [rich_request, text_request, regex_request,
                                  lambda: GenerateRequest("req-plain", PromptInput(text="hi"))])
async def test_generate_request_round_trips_every_field(remote, make):
    """'each has an in-process and a gRPC implementation with one interface': the worker behind
    gRPC receives a GenerateRequest equal to the one sent (None vs empty, -2**63 seed, unicode)."""
    fake, client, _ = remote
    request = make()
    events = [e async for e in client.generate(request)]
    assert isinstance(events[-1], Finished)
    assert fake.requests == [request]
    assert fake.last == request  # dataclass equality: every field, recursively
    # None and () stay distinct across the wire.
    assert fake.last.options.tool_choice.allowed_names == request.options.tool_choice.allowed_names


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "script",
    [
        Script(
            text=("Hel", "lo ✓", ""),
            usage=Usage(11, 3),
            stop_sequence="END",
            constraint={
                "branch": "content",
                "complete": True,
                "terminated": False,
                "cache": {"hit": "l1", "built": False},
                "mask_positions": 3,
                "mask_upload_bytes": 12345678901,
                "cpu_ms": 0.125,
            },
        ),
        Script(
            reasoning=("Let me ", "think ✓\n"),
            text=("\n", "answer"),
            usage=Usage(5, 9, reasoning_tokens=4),
        ),
        Script(
            text=("thinking",),
            calls=(
                ScriptedCall("call_a", "get_weather", ('{"ci', 'ty":"P"}')),
                ScriptedCall("call_b", "search.web", ("{}",)),
            ),
        ),
        Script(
            text=("partial",),
            error={"type": "ConstraintDeadEnd", "message": "dead end", "position": 4},
        ),
        Script(finish_reason=FinishReason.LENGTH),
        Script(finish_reason=FinishReason.CANCELLED),
    ],
)
async def test_generate_events_round_trip(remote, script):
    """'generate yields events and always ends with one Finished': every event type (text,
    tool-call start and argument fragments, Finished with usage, report, timings, stop sequence,
    error) arrives equal to what the wrapped worker yields in process."""
    fake, client, _ = remote
    fake.reset(script)
    request = GenerateRequest("r-events", PromptInput(text="x"))
    expected = [e async for e in fake.generate(request)]
    got = [e async for e in client.generate(request)]
    assert got == expected
    assert sum(isinstance(e, Finished) for e in got) == 1


@pytest.mark.asyncio
@pytest.mark.parametrize("error", [
    InvalidSchema("minimum must be a number", pointer="/properties/x/minimum",
                  source=SchemaSource.TOOL_ARGUMENTS, tool_index=1, tool_name="get_weather"),
    ConflictingConstraint("stop cannot be combined with a constraint", field="stop"),
    InvalidRequest("model 'nope' is not served here", field="model"),
])
async def test_typed_errors_before_the_first_event_keep_their_type(remote, error):
    """'Validation errors are typed ... and travel over gRPC as structured status details':
    the remote caller re-raises the same type with the same fields."""
    fake, client, _ = remote
    fake.reset(Script(raise_before=error))
    with pytest.raises(type(error)) as caught:
        async for _ in client.generate(GenerateRequest("r-err", PromptInput(text="x"))):
            pytest.fail("no event may precede a request error")
    assert type(caught.value) is type(error)
    assert caught.value.to_dict() == error.to_dict()


@pytest.mark.asyncio
async def test_invalid_wire_request_is_a_typed_error(remote):
    """'anything a client can cause raises a typed error naming the field': an unknown
    constraint kind on the wire comes back as InvalidRequest(field='constraint.kind')."""
    fake, client, _ = remote
    message = request_to_proto(GenerateRequest("r-bad", PromptInput(text="x"), RequestOptions(
        constraint=OutputConstraint.regex("a"))))
    message.options.constraint.kind = "xml"
    channel = Channel("127.0.0.1", client.port, status_details_codec=ErrorStatusCodec())
    try:
        with pytest.raises(GRPCError) as caught:
            async with WorkerStub(channel).Generate.open() as stream:
                await stream.send_message(message, end=True)
                await stream.recv_message()
    finally:
        channel.close()
    error = typed_error(caught.value)
    assert isinstance(error, InvalidRequest) and error.field == "constraint.kind"
    assert fake.requests == []
    with pytest.raises(InvalidRequest) as too_big:
        await anext(client.generate(GenerateRequest("r-seed", PromptInput(text="x"), RequestOptions(
            sampling=SamplingParams(seed=2**63)))))
    assert too_big.value.field == "seed"
    assert fake.requests == []


@pytest.mark.asyncio
async def test_failure_after_start_arrives_as_finished_error(remote):
    """'errors after submission arrive as Finished(ERROR)': a worker that dies after two events
    gives the remote caller those events, then Finished(ERROR) with an InternalError."""
    fake, client, _ = remote
    fake.reset(Script(text=("a", "b", "c"), die_after=2))
    events = [e async for e in client.generate(GenerateRequest("r-die", PromptInput(text="x")))]
    assert isinstance(events[0], Started)
    assert events[1:3] == [TextDelta("a"), TextDelta("b")]
    assert len(events) == 4 and events[3].finish_reason is FinishReason.ERROR
    assert events[3].error["type"] == "InternalError"


async def _eventually(predicate, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_cancel_and_disconnect_cancel_on_the_worker(remote):
    """'when the client disconnects mid-stream the server cancels the request on the wrapped
    worker', and Cancel routes to the worker's cancel."""
    fake, client, _ = remote
    await client.cancel("explicit-1")
    assert fake.cancelled == ["explicit-1"]
    fake.reset(Script(text=tuple("abcdefghij"), delay_s=0.05))
    stream = client.generate(GenerateRequest("r-gone", PromptInput(text="x")))
    assert isinstance(await anext(stream), Started)
    assert await anext(stream) == TextDelta("a")
    await stream.aclose()  # the caller goes away mid-stream
    await _eventually(lambda: fake.cancelled == ["r-gone"])
    # A stream that finished normally is never cancelled.
    fake.reset(Script(text=("a",)))
    _ = [e async for e in client.generate(GenerateRequest("r-done", PromptInput(text="x")))]
    await asyncio.sleep(0.05)
    assert fake.cancelled == []


@pytest.mark.asyncio
async def test_health_models_and_count_tokens(remote):
    """The small calls return what the wrapped worker returns; its failures come back typed."""
    fake, client, _ = remote
    assert await client.health() == await fake.health()
    assert await client.models() == ["smollm2", "qwen3.5"]
    prompt = PromptInput(messages=(ChatMessage("user", "one two three"),
                                   ChatMessage("assistant", "four")))
    assert await client.count_tokens(prompt, "smollm2") == await fake.count_tokens(
        prompt, "smollm2"
    )
    fake.healthy = False
    with pytest.raises(InternalError, match="worker unreachable"):
        await client.health()


@pytest.mark.asyncio
async def test_server_close_mid_stream_and_unreachable_worker(remote):
    """A worker going away mid-stream ends the stream with Finished(ERROR, ServiceUnavailable
    'worker connection lost': a dependency failure, not a bug) and cancels on the worker; before the
    first event an unreachable or closing worker raises WorkerUnavailable (a ConnectionError a pool
    may retry)."""
    fake, client, server = remote
    fake.reset(Script(text=tuple("abcdefghij"), delay_s=0.05))
    stream = client.generate(GenerateRequest("r-close", PromptInput(text="x")))
    assert isinstance(await anext(stream), Started)
    assert await anext(stream) == TextDelta("a")
    server.close()
    rest = [e async for e in stream]
    assert isinstance(rest[-1], Finished) and rest[-1].finish_reason is FinishReason.ERROR
    assert rest[-1].error["type"] == "ServiceUnavailable" and rest[-1].error["service"] == "worker"
    assert "worker connection lost" in rest[-1].error["message"]
    assert rest[-1].content.startswith("a")
    await _eventually(lambda: fake.cancelled == ["r-close"])
    with pytest.raises(WorkerUnavailable):
        await anext(client.generate(GenerateRequest("r-after", PromptInput(text="x"))))
    with pytest.raises(WorkerUnavailable):
        await client.health()
    nobody = GrpcWorkerClient("127.0.0.1", free_port())
    try:
        with pytest.raises(WorkerUnavailable):
            await anext(nobody.generate(GenerateRequest("r-none", PromptInput(text="x"))))
        with pytest.raises(ConnectionError):
            await nobody.models()
    finally:
        await nobody.aclose()


@pytest.mark.asyncio
async def test_serve_shuts_down_gracefully_on_sigterm():
    """'graceful shutdown on the first SIGTERM': serve() answers Health, then returns cleanly."""
    port = free_port()
    fake = FakeWorker()
    task = asyncio.create_task(serve(host="127.0.0.1", port=port, worker=fake))
    client = GrpcWorkerClient("127.0.0.1", port, timeout_s=1.0)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                health = await client.health()
                break
            except WorkerUnavailable:
                assert time.monotonic() < deadline and not task.done()
                await asyncio.sleep(0.05)
        assert health == await fake.health()
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, timeout=5)
    finally:
        await client.aclose()
        if not task.done():
            task.cancel()
