"""Compiles where they can be stopped: the compile child pool, and the cold-compile slots.

'Give every compile a deadline and a memory budget (run compiles where they can be stopped: a
process pool ...), reject what exceeds them with a typed 4xx (ConstraintTooComplex naming the
limit) ... and let a waiter for a slot time out with a typed 429/503 and a Retry-After.'
"""

from __future__ import annotations

import asyncio

import pytest

from services.grammar.cache import records
from services.grammar.cache.isolation import CompilePool
from services.grammar.cache.limits import ColdSlots, CompileLimits, StorePolicy
from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import accepts
from shared.contract import OutputConstraint
from shared.errors import ConstraintTooComplex, InvalidGrammar, Overloaded
from tests.support.common import byte_domain
from tests.support.grammar_process import UNBOUNDED_GRAMMARS, optional_properties

pytestmark = pytest.mark.asyncio


def big_schema(n: int) -> OutputConstraint:
    return OutputConstraint.json_schema(optional_properties(n))



@pytest.fixture(autouse=True)
def _unbounded_grammars(monkeypatch):
    """In-process and child compiles of this module see the lifted grammar-size limit too."""
    for name, value in UNBOUNDED_GRAMMARS.items():
        monkeypatch.setenv(name, value)

@pytest.mark.slow
async def test_pool_compiles_reports_errors_and_stops_what_exceeds_a_limit():
    """A child compiles what the caller asks (the grammar comes back as a blob with the same
    language), passes typed errors through unchanged, is killed past the deadline
    (ConstraintTooComplex naming compile_deadline_s and its value) or past the memory budget
    (compile_memory_bytes), and a fresh child serves the next compile. A compile started while
    the children are still starting waits for them."""
    deadline, budget = 0.5, 32_000_000
    pool = CompilePool(byte_domain(), size=1, limits=CompileLimits(deadline_s=deadline),
                       policy=StorePolicy(min_speedup=0))
    try:
        warming = asyncio.create_task(pool.start())
        built = await pool.compile(OutputConstraint.choice(["yes", "no"]), want="always")
        await warming
        grammar = records.deserialize(built.blob, ModelCompiler(byte_domain()))
        assert accepts(grammar, "yes") and not accepts(grammar, "ye")
        assert built.info.stored and built.info.serialized_bytes > len(built.blob) > 0

        with pytest.raises(InvalidGrammar) as info:
            await pool.compile(OutputConstraint.grammar('root ::= "a" (\n'))
        assert info.value.line == 1

        with pytest.raises(ConstraintTooComplex) as info:
            await pool.compile(big_schema(2000))
        assert (info.value.limit, info.value.value) == ("compile_deadline_s", deadline)
        again = await pool.compile(OutputConstraint.regex("[a-c]{2}"), want="never")
        assert again.blob is None and not again.info.stored  # never serialised: "never"
        assert pool.kills == {"compile_deadline_s": 1, "compile_memory_bytes": 0}
    finally:
        await pool.aclose()
    pool = CompilePool(byte_domain(), size=1, limits=CompileLimits(600.0, budget))
    try:
        with pytest.raises(ConstraintTooComplex) as info:
            await pool.compile(big_schema(5000))
        assert (info.value.limit, info.value.value) == ("compile_memory_bytes", budget)
    finally:
        await pool.aclose()


@pytest.mark.slow
async def test_a_cancelled_compile_leaves_no_child_running():
    """Nothing keeps compiling for nobody: cancelling the caller kills the child at once."""
    pool = CompilePool(byte_domain(), size=1, limits=CompileLimits(600.0))
    try:
        await pool.start()
        child = pool._children[0]
        task = asyncio.create_task(pool.compile(big_schema(5000)))
        await asyncio.sleep(0.3)
        proc = child.proc
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert proc.returncode is not None and not child.alive
    finally:
        await pool.aclose()


async def test_store_policy_keeps_only_what_loads_min_speedup_times_faster():
    """'a store policy that only stores what is slower to compile than to load': the verdict
    compares the compile with the predicted load of the serialisation, and a footprint that is
    already too slow to load is never serialised."""
    policy = StorePolicy(load_ms_per_mb=50.0, min_speedup=4.0, load_ms_fixed=1.0)
    assert policy.predicted_load_ms(2_000_000) == pytest.approx(101.0)
    assert policy.should_store(404.0, 2_000_000) and not policy.should_store(403.0, 2_000_000)
    assert not policy.worth_serializing(100.0, 1_000_000)  # 4 x 51 ms > 100 ms
    assert StorePolicy(min_speedup=0).should_store(0.0, 10**9)
    with pytest.raises(ValueError):
        StorePolicy(load_ms_per_mb=0)


async def test_cold_slots_hand_out_in_order_and_time_out_with_overloaded():
    """A waiter gets the next free slot in arrival order; one that waits past wait_s gets
    Overloaded(resource='cold_compile_slots') whose retry_after_s is the time left until the
    running compile's bound; a cancelled waiter does not take a slot with it."""
    slots = ColdSlots(1, wait_s=0.2, bound_s=30.0)
    first = await slots.acquire()
    order: list[str] = []

    async def take(name: str, wait: bool = True) -> None:
        token = await slots.acquire()
        order.append(name)
        slots.release(token)

    with pytest.raises(Overloaded) as info:
        await slots.acquire()
    assert info.value.resource == "cold_compile_slots" and 1 <= info.value.retry_after_s <= 30
    slots.wait_s = 5.0
    cancelled = asyncio.create_task(take("cancelled"))
    waiters = [asyncio.create_task(take(name)) for name in ("a", "b")]
    await asyncio.sleep(0.05)
    assert slots.waiting == 3
    cancelled.cancel()
    await asyncio.sleep(0)
    slots.release(first)
    await asyncio.gather(*waiters)
    assert order == ["a", "b"] and slots.in_use == 0
    async with slots.hold():
        assert slots.in_use == 1
    assert slots.in_use == 0
