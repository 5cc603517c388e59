"""The compile deadline through the real grammar service (`infernix grammar serve`, SmolLM2
vocabulary, redis-server, gRPC on loopback).

DESIGN.md, "Grammar service and the cache": "Cold compiles: at most two at once per model (a
semaphore) ... Compilation runs in a thread so the event loop never blocks", and its layout puts
"limits, child processes" in `cache/`; the settings: "a cold compile running longer is stopped:
ConstraintTooComplex". A native compile cannot be interrupted inside a thread, so it runs in a
killable child: the slow compile must be refused, typed, about when its deadline passes (its
blob included), while a fast compile beside it succeeds, and the refusal is only remembered for
`--compile-reject-ttl-s` (in memory, never in Redis): after that the constraint is compiled again.
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from grpclib.client import Channel
from grpclib.exceptions import GRPCError

from shared.errors import ConstraintTooComplex
from shared.proto import grammar_pb2 as pb
from shared.proto.errors import ErrorStatusCodec, typed_error
from shared.proto.grammar_grpc import GrammarStub
from tests.support.grammar_process import GrammarProcess, optional_properties

pytestmark = pytest.mark.slow

DEADLINE_S = 8.0
REJECT_TTL_S = 2.0


def _request(schema: dict) -> pb.CompileRequest:
    return pb.CompileRequest(model="smollm2", kind="json_schema", source=json.dumps(schema))


async def _timed(stub: GrammarStub, schema: dict | list) -> tuple[float, object]:
    """(seconds, reply or typed error) of one Compile of a schema (or a choice list)."""
    request = pb.CompileRequest(model="smollm2", kind="choice", choices=schema) \
        if isinstance(schema, list) else _request(schema)
    start = time.monotonic()
    try:
        result: object = await stub.Compile(request)
    except GRPCError as exc:
        result = typed_error(exc)
    return time.monotonic() - start, result


@pytest.mark.asyncio
async def test_a_slow_compile_is_refused_at_its_deadline_while_a_fast_one_beside_it_succeeds(
        redis_server):
    """A 2,000-property schema (~50 s on xgrammar) is stopped with ConstraintTooComplex naming
    compile_deadline_s within two seconds of the 8 s deadline; a new choice sent 0.5 s later
    compiles meanwhile and answers first; the same slow schema is refused at once from memory,
    and compiled (and stopped) again once the reject TTL has passed."""
    service = GrammarProcess(redis_server.url, "--compile-deadline-s", str(DEADLINE_S),
                             "--compile-reject-ttl-s", str(REJECT_TTL_S),
                             "--max-cold-compiles", "2")
    service.start()
    await service.wait_healthy()
    channel = Channel("127.0.0.1", service.port, status_details_codec=ErrorStatusCodec())
    stub = GrammarStub(channel)
    try:
        warm = await stub.Compile(_request({"type": "array", "items": {"type": "boolean"}}))
        assert warm.stats.built  # a compile child is up: its start is not part of the timing
        slow = asyncio.create_task(_timed(stub, optional_properties(2000, "d")))
        await service.until(lambda h: h["cold_compiles"] == 1)
        await asyncio.sleep(0.5)
        fast_s, fast = await _timed(stub, ["fast", "beside", "it"])
        assert isinstance(fast, pb.CompileReply) and fast.stats.built
        assert not slow.done()  # the fast compile did not wait for the slow one
        slow_s, error = await slow
        assert isinstance(error, ConstraintTooComplex), error
        assert (error.limit, error.value) == ("compile_deadline_s", DEADLINE_S)
        assert DEADLINE_S - 0.1 <= slow_s <= DEADLINE_S + 2.0, slow_s
        assert fast_s < slow_s
        stops = {"limit": "compile_deadline_s"}
        assert service.metric("infernix_grammar_compile_limit_stops_total", **stops) == 1

        again_s, again = await _timed(stub, optional_properties(2000, "d"))
        assert isinstance(again, ConstraintTooComplex) and again_s < 1.0  # from memory
        assert service.metric("infernix_grammar_compile_limit_stops_total", **stops) == 1
        await asyncio.sleep(REJECT_TTL_S)
        later_s, later = await _timed(stub, optional_properties(2000, "d"))
        assert isinstance(later, ConstraintTooComplex) and later_s >= DEADLINE_S - 0.1
        assert service.metric("infernix_grammar_compile_limit_stops_total", **stops) == 2
        assert (await service.health())["cold_compiles"] == 0
    finally:
        channel.close()
        service.stop()
