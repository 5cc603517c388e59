"""Scheduling: a long prompt shares each prefill step's token budget and never stalls the decoding
rows for more than one bounded chunk; preemption pauses a running request at a commit boundary and
resumes it by Replay with the same output.

Issue 12: "Chunked prefill must interleave with decode steps of other rows (a per-step token budget
shared by prefill chunks and decodes), so a long prompt delays others by at most one chunk per
step." Design document, lifecycle: "Pausing happens only at stable commit boundaries and the
committed matcher stays in its Request ... Replay calls no grammar accept, output preview or
forced-control publication"; issue 12 §9: "a constrained request preempted and resumed produces the
same greedy output as one that never was."
"""

from __future__ import annotations

import asyncio

import pytest

from services.worker.output.session import OutputSession
from shared.contract import OutputConstraint
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    text_request,
    tiny_runtime,
)

LONG = "a long prompt that takes several prefill chunks to read " * 2


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


@pytest.mark.asyncio
async def test_a_long_prompt_never_stalls_decoding_rows_for_more_than_one_chunk(runtime):
    hooked_runtime, model = hooked(runtime)
    steps: list[tuple[int, int]] = []  # (rows, tokens per row) of every forward
    model.before = lambda tokens, positions, lanes: steps.append(tuple(tokens.shape))
    client = open_client(hooked_runtime, max_batch=3, max_len=256, prefill_chunk=8)
    try:
        # The short request decodes throughout: its language has exactly 60 letters, no EOS before.
        sixty = greedy(60, constraint=OutputConstraint.regex("[a-z]{60}"))
        short = asyncio.ensure_future(collect(client, text_request("s", "hi", sixty, runtime.name)))
        while not steps:
            await asyncio.sleep(0.005)
        longs = [asyncio.ensure_future(collect(client, text_request(f"l{i}", LONG, greedy(3),
                                                                    runtime.name)))
                 for i in range(2)]
        (_, a), (_, b), (_, c) = await asyncio.gather(short, *longs)
    finally:
        await client.aclose()
    assert a.usage.completion_tokens >= 30
    assert b.finish_reason.value == c.finish_reason.value == "length"
    prefill_steps = [i for i, (_, width) in enumerate(steps) if width > 1]
    # Both long prompts in chunks of the shared budget.
    assert len(prefill_steps) >= 2 * len(runtime.tokenizer.encode(LONG)) // 8
    for rows, width in steps:
        assert rows * width <= 8 or width == 1  # a prefill step's tokens, padding included
    # While the short request decodes, a decode step separates any two prefill steps.
    for i, j in zip(prefill_steps, prefill_steps[1:]):
        assert j - i >= 2 or i < 2, (i, j, steps)


@pytest.mark.asyncio
@pytest.mark.parametrize("constrained", [False, True])
async def test_preempted_requests_resume_by_replay_with_the_same_output(runtime, monkeypatch,
                                                                        constrained):
    """One lane, preemption at once: the two requests take the lane from each other at every
    step; each output equals the same request run alone, and no Replay previews or publishes."""
    constraint = OutputConstraint.regex("[a-z ]{6,40}") if constrained else None
    options = greedy(12, constraint=constraint)
    alone = open_client(runtime, max_batch=1, max_len=128)
    try:
        expected = [await collect(alone, text_request(f"alone{i}", p, options, runtime.name))
                    for i, p in enumerate(("first prompt", "second one"))]
    finally:
        await alone.aclose()

    previews = {"n": 0}
    original = OutputSession.preview

    def counting(self, tokens, **kwargs):
        previews["n"] += 1
        return original(self, tokens, **kwargs)

    monkeypatch.setattr(OutputSession, "preview", counting)
    client = open_client(runtime, max_batch=1, max_len=128, preempt_after_s=0.0)
    try:
        results = await asyncio.gather(
            *(collect(client, text_request(f"r{i}", p, options, runtime.name))
              for i, p in enumerate(("first prompt", "second one"))))
        preempted = client.engine.metrics.preemptions._value.get()
    finally:
        await client.aclose()
    assert preempted >= 2
    for (deltas, fin), (_, want) in zip(results, expected):
        assert fin.content == want.content and "".join(deltas) == want.content
        assert fin.finish_reason == want.finish_reason
        assert fin.usage.completion_tokens == want.usage.completion_tokens
    # One preview per committed output token: Replay previewed nothing.
    assert previews["n"] == sum(fin.usage.completion_tokens for _, fin in results)
