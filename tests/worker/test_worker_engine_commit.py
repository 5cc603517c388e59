"""The Engine's one commit path (services/worker/engine/postprocess.py) and its failure rules.

Design document, section 5: "The Program produces a PendingBatch -> each row previews its real
output and fixes the accepted prefix -> the Program commits the same prefix's KV/GDN, ledger and
RNG/penalty state -> the prefix's matcher, decoder and budget are confirmed -> user events are
published. When a preview fails, every unconfirmed matcher preview of the batch is restored first
and the Program's PendingBatch aborts under its existing transaction. When the Program commit fails,
grammar state is not confirmed and nothing of the round is published."

Independent basis: greedy decoding without the engine (`oracle_greedy`); sampling keys its RNG by
(seed, position), so a row that runs an aborted step again produces the same tokens.
"""

from __future__ import annotations

import asyncio

import pytest

from services.worker.output.preview import PreviewResult
from services.worker.output.session import OutputSession
from services.worker.program import Program
from shared.contract import OutputConstraint
from shared.errors import InternalError
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


def expect(runtime, prompt: str, n: int) -> str:
    return text_of(runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(prompt), n))


SURVIVOR = 40  # output tokens of the row beside the failing one


async def _resident(client, n: int) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while len(client.engine.scheduler.resident) < n:
        assert loop.time() < deadline, "the request never became resident"
        await asyncio.sleep(0.005)


@pytest.mark.asyncio
async def test_a_failed_preview_restores_every_preview_and_aborts_the_round(runtime, monkeypatch):
    """The survivor previews first in the round where the constrained row's preview fails: its
    preview is discarded (a pending preview would make its next round an internal error), nothing
    of the round commits (the survivor feeds that round's position again: exactly one position of
    its lane is fed twice), and it then produces exactly its solo greedy output; the failing row
    finishes with the internal error and keeps what it had published."""
    hooked_runtime, model = hooked(runtime)
    fed: list[tuple[int, int]] = []  # (lane, position) of every decode row fed
    model.before = lambda tokens, positions, lanes: fed.extend(
        (int(lane), int(row[0])) for lane, row in zip(lanes, positions) if tokens.shape[1] == 1)
    original = OutputSession.preview
    calls = {"n": 0}

    def failing(self, tokens, **kwargs):
        if self.constrained:
            calls["n"] += 1
            if calls["n"] == 3:
                return PreviewResult(0, failure=InternalError("injected preview failure"))
        return original(self, tokens, **kwargs)

    monkeypatch.setattr(OutputSession, "preview", failing)
    client = open_client(hooked_runtime, max_batch=2, max_len=96)
    try:
        # The grammar compiles before the survivor starts, and the survivor outlives the failing
        # row's prefill and three samples whatever the timing: they share the failing round.
        regex = OutputConstraint.regex("[0-9]{10}")
        await client.engine.grammar.compile(regex, model=runtime.name)
        survivor = asyncio.ensure_future(
            collect(client, text_request("survivor", "left", greedy(SURVIVOR), runtime.name)))
        await _resident(client, 1)
        digits = greedy(10, constraint=regex)
        (deltas, failed), (_, kept) = await asyncio.gather(
            collect(client, text_request("failing", "pick", digits, runtime.name)), survivor)
    finally:
        await client.aclose()
    assert failed.finish_reason.value == "error" and failed.error["type"] == "InternalError"
    assert "injected" in failed.error["message"]
    assert failed.usage.completion_tokens == 2 and len(failed.content) == 2 == len("".join(deltas))
    assert kept.finish_reason.value == "length"
    assert kept.content == expect(runtime, "left", SURVIVOR)
    survivor_positions = [p for lane, p in fed if lane == 0]
    assert len(survivor_positions) - len(set(survivor_positions)) == 1


@pytest.mark.asyncio
async def test_a_failed_program_commit_publishes_nothing_of_the_round(runtime, monkeypatch):
    """Every row of the failed round finishes with the internal error; what they published is
    exactly the output of the rounds before (the oracle's first tokens), nothing of this one."""
    original = Program.commit
    calls = {"n": 0}

    def failing(self, pending, kept):
        if len(pending.batch.rows) == 2:
            calls["n"] += 1
            if calls["n"] == 3:
                raise RuntimeError("injected device failure")
        return original(self, pending, kept)

    monkeypatch.setattr(Program, "commit", failing)
    client = open_client(runtime, max_batch=2, max_len=96)
    try:
        # the first row outlives the second one's prefill and two commits whatever the timing
        first = asyncio.ensure_future(
            collect(client, text_request("a", "left", greedy(SURVIVOR), runtime.name)))
        await _resident(client, 1)
        second = asyncio.ensure_future(
            collect(client, text_request("b", "right side", greedy(10), runtime.name)))
        (deltas_a, a), (deltas_b, b) = await asyncio.gather(first, second)
    finally:
        await client.aclose()
    for fin, deltas, prompt, n in (
        (a, deltas_a, "left", SURVIVOR),
        (b, deltas_b, "right side", 10),
    ):
        assert fin.finish_reason.value == "error" and "injected" in fin.error["message"]
        committed = fin.usage.completion_tokens
        assert 1 <= committed < n
        assert fin.content == "".join(deltas) == expect(runtime, prompt, committed)
    assert calls["n"] == 3
