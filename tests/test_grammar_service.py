"""The grammar service over real loopback gRPC, and both GrammarClient implementations."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import time

import pytest
import pytest_asyncio
from grpclib.client import Channel
from grpclib.const import Status
from grpclib.exceptions import GRPCError

from services.grammar.cache import CacheConfig, GrammarCache, ModelCaches
from services.grammar.client import GrpcGrammarClient, InProcessGrammarClient
from services.grammar.compiler import ModelCompiler, cache_key
from services.grammar.matching import accepts
from services.grammar.service import create_server, serve
from services.grammar.store import RedisStore, StoreConfig
from shared.contract import OutputConstraint
from shared.errors import (
    InternalError,
    InvalidChoice,
    InvalidGrammar,
    InvalidRequest,
    InvalidSchema,
    InvalidToolDefinition,
    SchemaSource,
    UnsupportedSchema,
)
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, grpc_error, typed_error
from shared.proto.grammar_grpc import GrammarStub
from tests.conftest import free_port
from tests.support import byte_domain

BAD = "trigger-invalid-grammar"
BAD_ERROR = InvalidGrammar("unbalanced parenthesis", line=3, column=14)


class ScriptedCompiler(ModelCompiler):
    """A real compiler that counts builds and fails with BAD_ERROR for choices containing BAD."""

    def __init__(self) -> None:
        super().__init__(byte_domain())
        self.builds = 0

    def compile(self, constraint):
        self.builds += 1
        if BAD in constraint.choices:
            raise BAD_ERROR
        return super().compile(constraint)


def open_caches(url: str, *, read_only: bool, cache_bytes: int = 256 << 20) -> ModelCaches:
    store = RedisStore(StoreConfig(url, timeout_s=0.3, retry_s=0.05))
    cache = GrammarCache(ScriptedCompiler(), model="bytes", store=store,
                         config=CacheConfig(cache_bytes=cache_bytes, read_only=read_only))
    return ModelCaches({"bytes": cache}, store)


@pytest_asyncio.fixture
async def grammar_server(redis_server):
    """A real grpclib Server on 127.0.0.1 (free port) over caches on the real Redis."""
    caches = open_caches(redis_server.url, read_only=False)
    server = create_server(caches)
    port = free_port()
    await server.start("127.0.0.1", port)
    yield port, caches
    server.close()
    await server.wait_closed()
    await caches.aclose()


@pytest_asyncio.fixture(params=["in_process", "grpc"])
async def client(request, redis_server, grammar_server):
    """Both GrammarClient implementations; the gRPC one reads through read-only worker caches."""
    port, service_caches = grammar_server
    if request.param == "in_process":
        c = InProcessGrammarClient(service_caches)
        yield c
        return  # the server fixture closes these caches
    c = GrpcGrammarClient("127.0.0.1", port, open_caches(redis_server.url, read_only=True))
    yield c
    await c.close()


@pytest.mark.asyncio
async def test_compile_then_get_compiled(client):
    """'GrammarClient.compile(kind, source, framing, model) -> key + stats', then 'compiled grammar
    by key: worker L1 (in-process LRU) -> Redis': the key is the cache key of the constraint and
    the grammar has the choice's language."""
    constraint = OutputConstraint.choice(["red", "green", "gr"])
    result = await client.compile(constraint, model="bytes")
    assert result.key == cache_key(constraint, byte_domain())
    # The report says how this process got the grammar: in process it was built here; a gRPC
    # worker got the service's build from Redis.
    local_source = "redis" if isinstance(client, GrpcGrammarClient) else None
    assert result.stats.built and result.stats.hit == local_source and not result.stats.waited
    again = await client.compile(OutputConstraint.choice(["gr", "red", "green"]), model="bytes")
    assert again.key == result.key and again.stats.hit == "l1"
    grammar = await client.get_compiled(result.key, "bytes")
    for text in ("red", "green", "gr", "gre", "blue", ""):
        assert accepts(grammar, text) == (text in ("red", "green", "gr"))
    if isinstance(client, GrpcGrammarClient):  # the worker loaded it from Redis, built nothing
        assert client.caches["bytes"].compiler.builds == 0


@pytest.mark.asyncio
async def test_typed_errors_come_back_as_the_same_exceptions(client):
    """'Validation errors are typed ... and travel over gRPC as structured status details, never
    as text to be parsed': same type, same fields."""
    with pytest.raises(InvalidGrammar) as info:
        await client.compile(OutputConstraint.choice(["ok", BAD]), model="bytes")
    assert info.value.to_dict() == BAD_ERROR.to_dict()
    with pytest.raises(InvalidGrammar) as info:  # the real GBNF converter, through the cache
        await client.compile(OutputConstraint.grammar("root ::= ("), model="bytes")
    assert info.value.line == 1 and info.value.column is not None
    with pytest.raises(InvalidRequest) as info:
        await client.compile(OutputConstraint.choice(["ok"]), model="no-such-model")
    assert info.value.field == "model" and "no-such-model" in info.value.message


@pytest.mark.asyncio
async def test_wire_validation_uses_the_contract_constructors(grammar_server):
    """'The list must not be empty' (InvalidChoice) and an unknown kind (InvalidRequest naming
    `kind`) are rejected by the service itself, as INVALID_ARGUMENT with typed details."""
    port, _ = grammar_server
    channel = Channel("127.0.0.1", port, status_details_codec=ErrorStatusCodec())
    stub = GrammarStub(channel)
    try:
        for request, expected in (
            (pb.CompileRequest(model="bytes", kind="choice"), InvalidChoice),
            (pb.CompileRequest(model="bytes", kind="ebnf", source="root ::= \"a\""), InvalidRequest),
            (pb.CompileRequest(model="bytes", kind="json_schema", source="{"), InvalidRequest),
        ):
            with pytest.raises(GRPCError) as info:
                await stub.Compile(request)
            assert info.value.status is Status.INVALID_ARGUMENT
            assert type(typed_error(info.value)) is expected
        assert typed_error(info.value).field == "json_schema"
        health = await stub.Health(pb.HealthRequest())
        assert (health.status, list(health.models), health.redis_ok) == ("SERVING", ["bytes"], True)
    finally:
        channel.close()


def test_status_details_codec_round_trips_every_field():
    """Errors come back 'as the same Python exception types' with every field, enums included."""
    codec = ErrorStatusCodec()
    errors = [
        InvalidSchema("bad type", pointer="/properties/x/type", source=SchemaSource.TOOL_ARGUMENTS,
                      tool_index=2, tool_name="lookup"),
        UnsupportedSchema("no $dynamicRef", pointer="/$defs/a"),
        InvalidToolDefinition("duplicate", tool_index=1, tool_name="f", field="name"),
        InvalidGrammar("syntax", line=7, column=1),
        InternalError("boom"),
    ]
    for error in errors:
        grpc = grpc_error(error)
        details = codec.decode(grpc.status, grpc.message, codec.encode(grpc.status, grpc.message,
                                                                       grpc.details))
        back = typed_error(GRPCError(grpc.status, grpc.message, details))
        assert type(back) is type(error) and back.to_dict() == error.to_dict()
        assert grpc.status is (Status.INTERNAL if error.fault == "internal" else Status.INVALID_ARGUMENT)
    assert typed_error(GRPCError(Status.UNAVAILABLE, "gone")).type_name == "InternalError"


@pytest.mark.asyncio
async def test_grpc_worker_rebuilds_when_redis_is_lost(redis_server, grammar_server):
    """'Losing Redis never fails a request: the grammar service and the worker fall back to
    compiling and caching in-process': the worker rebuilds from the constraint it compiled."""
    port, _ = grammar_server
    # An L1 too small to keep the grammar: once Redis is gone, nothing holds it but the recipe.
    client = GrpcGrammarClient("127.0.0.1", port, open_caches(redis_server.url, read_only=True,
                                                              cache_bytes=1))
    try:
        constraint = OutputConstraint.choice(["left", "right"])
        result = await client.compile(constraint, model="bytes")
        redis_server.stop()
        grammar = await client.get_compiled(result.key, "bytes")
        assert client.caches["bytes"].compiler.builds == 1
        assert accepts(grammar, "left") and not accepts(grammar, "up")
        with pytest.raises(InternalError):
            await client.get_compiled("0" * 64, "bytes")
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_grpc_client_refuses_a_service_with_another_vocabulary(redis_server, grammar_server):
    """'Different vocabularies use different compiler instances': a worker whose vocabulary differs
    from the service's gets a different key and refuses the reply instead of using a wrong grammar."""
    port, _ = grammar_server
    other = dataclasses.replace(byte_domain(), name="other-bytes")
    store = RedisStore(StoreConfig(redis_server.url, timeout_s=0.3))
    caches = ModelCaches({"bytes": GrammarCache(ModelCompiler(other), model="bytes", store=store,
                                                config=CacheConfig(read_only=True))}, store)
    client = GrpcGrammarClient("127.0.0.1", port, caches)
    try:
        with pytest.raises(InternalError, match="disagree"):
            await client.compile(OutputConstraint.choice(["a"]), model="bytes")
    finally:
        await client.close()


@pytest.mark.asyncio
async def test_serve_shuts_down_gracefully_on_sigterm():
    """'graceful shutdown on the first SIGTERM': serve() answers Health, then returns cleanly."""
    port = free_port()
    task = asyncio.create_task(serve(host="127.0.0.1", port=port, redis_url=None,
                                     cache_bytes=1 << 20, models={"bytes": byte_domain()}))
    channel = Channel("127.0.0.1", port, status_details_codec=ErrorStatusCodec())
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                reply = await GrammarStub(channel).Health(pb.HealthRequest(), timeout=1)
                break
            except (OSError, asyncio.TimeoutError):
                assert time.monotonic() < deadline and not task.done()
                await asyncio.sleep(0.05)
        assert reply.status == "SERVING" and list(reply.models) == ["bytes"]
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(task, timeout=5)
    finally:
        channel.close()
        if not task.done():
            task.cancel()
