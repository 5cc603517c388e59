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

from services.grammar.cache.grammar_cache import CacheConfig, GrammarCache, ModelCaches, RecordCache
from services.grammar.cache.limits import StorePolicy
from services.grammar.cache.records import Record
from services.grammar.cache.store import RedisStore, StoreConfig
from services.grammar.client import GrpcGrammarClient, InProcessGrammarClient
from services.grammar.compiler import ModelCompiler, cache_key
from services.grammar.engines.matching import accepts
from services.grammar.service import create_server, serve
from shared.contract import OutputConstraint
from shared.errors import (
    ConstraintTooComplex,
    GrammarServiceUnavailable,
    InternalError,
    InvalidChoice,
    InvalidGrammar,
    InvalidRequest,
    InvalidSchema,
    InvalidToolDefinition,
    Overloaded,
    SchemaSource,
    UnsupportedSchema,
)
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, grpc_error, typed_error
from shared.proto.grammar_grpc import GrammarStub
from tests.conftest import free_port
from tests.support.common import byte_domain

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


# The test vocabulary's grammars compile faster than they load: the default policy stores none.
STORE_ALL = StorePolicy(min_speedup=0)


def open_caches(url: str, *, read_only: bool, cache_bytes: int = 256 << 20,
                policy: StorePolicy = STORE_ALL, cache_type=GrammarCache) -> ModelCaches:
    store = RedisStore(StoreConfig(url, timeout_s=0.3, retry_s=0.05))
    cache = cache_type(ScriptedCompiler(), model="bytes", store=store,
                       config=CacheConfig(cache_bytes=cache_bytes, read_only=read_only,
                                          policy=policy))
    return ModelCaches({"bytes": cache}, store)


async def start_service(url: str, policy: StorePolicy = STORE_ALL, store_cls=RedisStore):
    """A real grpclib Server on 127.0.0.1 (free port) over RecordCaches on the real Redis
    (builds in threads here, so that ScriptedCompiler counts them)."""
    store = store_cls(StoreConfig(url, timeout_s=0.3, retry_s=0.05))
    cache = RecordCache(ScriptedCompiler(), model="bytes", store=store,
                        config=CacheConfig(policy=policy))
    caches = ModelCaches({"bytes": cache}, store)
    server = create_server(caches)
    port = free_port()
    await server.start("127.0.0.1", port)
    return server, port, caches


async def stop_service(server, caches) -> None:
    server.close()
    await server.wait_closed()
    await caches.aclose()


@pytest_asyncio.fixture
async def grammar_server(redis_server):
    server, port, caches = await start_service(redis_server.url)
    yield port, caches
    await stop_service(server, caches)


@pytest_asyncio.fixture(params=["in_process", "grpc"])
async def client(request, redis_server, grammar_server):
    """Both GrammarClient implementations; the gRPC one reads through read-only worker caches."""
    port, service_caches = grammar_server
    if request.param == "in_process":
        c = InProcessGrammarClient(open_caches(redis_server.url, read_only=False))
    else:
        c = GrpcGrammarClient("127.0.0.1", port, open_caches(redis_server.url, read_only=True))
    yield c
    await c.close()


@pytest.mark.asyncio
async def test_compile_returns_the_compiled_grammar(client, grammar_server):
    """'GrammarClient.compile(kind, source, framing, model)' returns the key (the cache key of
    the constraint) and the compiled grammar itself, with the choice's language; the same set
    again is an L1 hit."""
    constraint = OutputConstraint.choice(["red", "green", "gr"])
    result = await client.compile(constraint, model="bytes")
    assert result.key == cache_key(constraint, byte_domain())
    for text in ("red", "green", "gr", "gre", "blue", ""):
        assert accepts(result.grammar, text) == (text in ("red", "green", "gr"))
    assert result.stats.built and not result.stats.waited
    if isinstance(client, GrpcGrammarClient):  # the service built it; the blob came in the reply
        assert result.stats.hit == "service" and not result.stats.local_build
        assert client.caches["bytes"].compiler.builds == 0
        assert grammar_server[1]["bytes"].compiler.builds == 1
    else:
        assert result.stats.hit is None and result.stats.local_build
    again = await client.compile(OutputConstraint.choice(["gr", "red", "green"]), model="bytes")
    assert again.key == result.key and again.stats.hit == "l1" and again.grammar is result.grammar
    assert (await client.health())["degraded"] is False


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
            (pb.CompileRequest(model="bytes", kind="ebnf", source='root ::= "a"'), InvalidRequest),
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
        ConstraintTooComplex("too slow", limit="compile_deadline_s", value=2.5),
        Overloaded("busy", resource="cold_compile_slots", retry_after_s=3.0),
        GrammarServiceUnavailable("gone", service="grammar", retry_after_s=1.0),
        InternalError("boom"),
    ]
    expected_status = {"request": Status.INVALID_ARGUMENT, "internal": Status.INTERNAL,
                       "overloaded": Status.RESOURCE_EXHAUSTED, "unavailable": Status.UNAVAILABLE}
    for error in errors:
        grpc = grpc_error(error)
        details = codec.decode(grpc.status, grpc.message, codec.encode(grpc.status, grpc.message,
                                                                       grpc.details))
        back = typed_error(GRPCError(grpc.status, grpc.message, details))
        assert type(back) is type(error) and back.to_dict() == error.to_dict()
        assert grpc.status is expected_status[error.fault]
    assert typed_error(GRPCError(Status.UNAVAILABLE, "gone")).type_name == "InternalError"


@pytest.mark.asyncio
async def test_one_cold_compile_is_paid_once(redis_server):
    """Issue 12 item 3, 'every compile runs twice': the service answers before its background
    Redis write, and a worker that then read Redis missed and rebuilt. Now the reply carries the
    blob: with the Redis write held back, the worker still builds nothing, the service built once,
    and a second worker is answered from the service's L1."""
    release = asyncio.Event()

    class HeldStore(RedisStore):
        async def put(self, vocab_id: str, key: str, blob: bytes) -> bool:
            await release.wait()
            return await super().put(vocab_id, key, blob)

    server, port, service = await start_service(redis_server.url, store_cls=HeldStore)
    workers = [GrpcGrammarClient("127.0.0.1", port, open_caches(redis_server.url, read_only=True))
               for _ in range(2)]
    try:
        constraint = OutputConstraint.choice(["north", "south", "east", "west"])
        first = await asyncio.wait_for(workers[0].compile(constraint, model="bytes"), timeout=10)
        second = await asyncio.wait_for(workers[1].compile(constraint, model="bytes"), timeout=10)
        for result in (first, second):
            assert result.stats.hit == "service" and not result.stats.local_build
            assert accepts(result.grammar, "east") and not accepts(result.grammar, "up")
        assert first.stats.built and not second.stats.built  # the second came from the L1
        assert [w.caches["bytes"].compiler.builds for w in workers] == [0, 0]
        assert service["bytes"].compiler.builds == 1
    finally:
        release.set()
        for w in workers:
            await w.close()
        await stop_service(server, service)


@pytest.mark.asyncio
async def test_a_grammar_cheaper_to_compile_than_to_load_is_compiled_where_used(redis_server):
    """The store policy: 'stores only what is slower to compile than to load'. The test
    vocabulary's grammars compile in well under a millisecond, so the service keeps a verdict,
    ships no blob, and each worker compiles the grammar itself once; the service compiles it
    once in all, and Redis holds the verdict without a blob."""
    server, port, service = await start_service(redis_server.url, policy=StorePolicy())
    workers = [
        GrpcGrammarClient(
            "127.0.0.1", port, open_caches(redis_server.url, read_only=True, policy=StorePolicy())
        )
        for _ in range(2)
    ]
    try:
        constraint = OutputConstraint.choice(["fast", "cheap"])
        results = [await w.compile(constraint, model="bytes") for w in workers]
        for result in results:
            assert result.stats.local_build and result.stats.built and result.stats.hit is None
            assert accepts(result.grammar, "fast") and not accepts(result.grammar, "fas")
        assert [w.caches["bytes"].compiler.builds for w in workers] == [1, 1]
        assert service["bytes"].compiler.builds == 1
        await service["bytes"].drain()
        stored = await service.store.get(byte_domain().vocab_id, results[0].key)
        record = Record.decode(stored)
        assert not record.info.stored and record.blob is None and record.info.compile_ms > 0
    finally:
        for w in workers:
            await w.close()
        await stop_service(server, service)


@pytest.mark.asyncio
async def test_grpc_client_refuses_a_service_with_another_vocabulary(redis_server, grammar_server):
    """'Different vocabularies use different compiler instances': a worker whose vocabulary differs
    from the service's gets a different key and refuses the reply instead of using a wrong
    grammar."""
    port, _ = grammar_server
    other = dataclasses.replace(byte_domain(), name="other-bytes")
    store = RedisStore(StoreConfig(redis_server.url, timeout_s=0.3))
    caches = ModelCaches({"bytes": GrammarCache(ModelCompiler(other), model="bytes", store=store,
                                                config=CacheConfig(read_only=True))}, store)
    assert caches["bytes"].key(OutputConstraint.choice(["a"])) != cache_key(
        OutputConstraint.choice(["a"]), byte_domain())
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
