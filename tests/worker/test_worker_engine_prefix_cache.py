"""Engine: the automatic prefix cache (program/blocks.py) against the same engine without it and
an engine-free oracle.

Design document: "Exact prefix hit: sampling from the cached hidden state uses this request's
mask, never the cache creator's choice"; "ordinary prefix caches keep only model state, never
mutable matchers"; "When both hit the same cached model prefix, sampling from the cached hidden
state still reads this request's mask; the cached hidden state carries no output choice of the old
request."
"""

from __future__ import annotations

import asyncio
import json
import os
import random

import jsonschema
import pytest

from shared.contract import OutputConstraint
from tests.support.worker_support import (
    collect,
    greedy,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)

BS = 16
SYSTEM = ("You are a careful assistant. Answer in JSON when asked; keep answers short and exact. "
          "Context: the quick brown fox jumps over the lazy dog. ")

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"], "additionalProperties": False}
FLAG = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
        "required": ["ok", "n"], "additionalProperties": False}


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


async def _run_sequentially(client, requests):
    return [await collect(client, r) for r in requests]


def _requests(runtime, tag: str):
    """The same prompt unconstrained, then twice with different schemas, then other questions on
    the same system prefix, and the exact same prompt again."""
    name = runtime.name
    q = SYSTEM + "Q: who?"
    return [
        text_request(f"{tag}-free", q, greedy(12), name),
        text_request(
            f"{tag}-person", q, greedy(160, constraint=OutputConstraint.json_schema(PERSON)), name
        ),
        text_request(
            f"{tag}-flag", q, greedy(160, constraint=OutputConstraint.json_schema(FLAG)), name
        ),
        text_request(f"{tag}-other", SYSTEM + "Q: where is the fox?", greedy(10), name),
        text_request(f"{tag}-free-again", q, greedy(12), name),
        text_request(
            f"{tag}-choice", q, greedy(8, constraint=OutputConstraint.choice(["yes", "no"])), name
        ),
    ]


@pytest.mark.asyncio
async def test_outputs_identical_with_and_without_the_cache(runtime):
    """Greedy outputs (free, JSON Schema, choice) are the same with the prefix cache on and off;
    with it on, every request after the first finds the system prompt's full blocks, and two
    requests with the same prompt and different schemas each follow their own schema."""
    results = {}
    for enabled in (False, True):
        client = open_client(
            runtime, max_batch=2, max_len=384, prefill_chunk=64, prefix_cache=enabled
        )
        try:
            results[enabled] = await _run_sequentially(
                client, _requests(runtime, f"c{int(enabled)}")
            )
            stats = client.engine.program.blocks.stats
        finally:
            await client.aclose()
        if enabled:
            assert stats.hit_tokens > 0
    for (_, off), (_, on) in zip(results[False], results[True]):
        assert on.content == off.content
        assert on.finish_reason == off.finish_reason
        assert on.usage.prompt_tokens == off.usage.prompt_tokens
        assert on.usage.completion_tokens == off.usage.completion_tokens
        assert off.usage.cached_tokens == 0
    cached = [fin.usage.cached_tokens for _, fin in results[True]]
    prompt = len(runtime.tokenizer.encode(SYSTEM + "Q: who?"))
    full = (prompt - 1) // BS * BS  # the last prompt token is always recomputed
    assert cached[0] == 0
    assert cached[1] == cached[2] == cached[4] == cached[5] == full
    other = runtime.tokenizer.encode(SYSTEM + "Q: where is the fox?")
    common = len(os.path.commonprefix([runtime.tokenizer.encode(SYSTEM + "Q: who?"), other]))
    assert cached[3] == common // BS * BS
    # each follows its own schema from the same cached prefix (random weights may run out of
    # tokens inside whitespace: a complete output must validate, any output names its own keys)
    for (_, fin), schema, key in (
        (results[True][1], PERSON, '"name"'),
        (results[True][2], FLAG, '"ok"'),
    ):
        assert key in fin.content or fin.finish_reason.value == "length"
        if fin.finish_reason.value == "stop":
            jsonschema.validate(json.loads(fin.content), schema)
    assert results[True][1][1].content != results[True][2][1].content
    free = results[True][0][1].content
    assert free == text_of(
        runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(SYSTEM + "Q: who?"), 12)
    )
    assert results[True][5][1].content in ("yes", "no")


@pytest.mark.asyncio
async def test_exact_full_prompt_hit_samples_from_its_own_last_position(runtime):
    """A prompt of exactly 6 blocks met again: 5 blocks come cached and the last block is
    recomputed, so the first token is sampled from the last position's logits of this request
    (here under a choice constraint the first request did not have)."""
    prompt = (SYSTEM * 2)[:6 * BS]
    assert len(runtime.tokenizer.encode(prompt)) == 6 * BS
    client = open_client(runtime, max_batch=1, max_len=160)
    try:
        _, first = await collect(client, text_request("a", prompt, greedy(6), runtime.name))
        _, again = await collect(client, text_request("b", prompt, greedy(6), runtime.name))
        _, chosen = await collect(client, text_request(
            "c", prompt, greedy(6, constraint=OutputConstraint.choice(["zz", "qq"])), runtime.name))
    finally:
        await client.aclose()
    assert (first.usage.cached_tokens, again.usage.cached_tokens, chosen.usage.cached_tokens) == (
        0,
        5 * BS,
        5 * BS,
    )
    expected = text_of(runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(prompt), 6))
    assert first.content == again.content == expected
    assert chosen.content in ("zz", "qq")


@pytest.mark.asyncio
async def test_concurrent_shared_and_unshared_prefixes_under_a_small_pool(runtime):
    """Many concurrent requests through 3 lanes, sharing the system prefix or not, with lanes
    short enough that the minimum pool must evict cached blocks: every output equals greedy
    decoding of that request alone (so no block in use was ever overwritten)."""
    rng = random.Random(3)
    prompts = []
    for i in range(12):
        head = (
            SYSTEM[: rng.choice((40, 70, 136))]
            if i % 3
            else "".join(rng.choice("abcdefgh ") for _ in range(50))
        )
        prompts.append(head + f" item {i}: " + "xyz"[i % 3] * rng.randrange(1, 12))
    client = open_client(runtime, max_batch=3, max_len=192, prefill_chunk=24)
    try:
        requests = [
            text_request(f"s{i}", p, greedy(10), runtime.name) for i, p in enumerate(prompts)
        ]
        results = await asyncio.gather(*(collect(client, r) for r in requests))
        stats = client.engine.program.blocks.stats
        metrics = client.engine.metrics
        health = client.engine.health()["prefix_cache"]
    finally:
        await client.aclose()
    # the worker's metrics and health report what the block manager counted
    assert metrics.prefix_hit_tokens._value.get() == stats.hit_tokens
    assert metrics.prefix_lookup_tokens._value.get() == stats.lookup_tokens
    assert metrics.prefix_evictions._value.get() == stats.evictions
    assert health["hit_tokens"] == stats.hit_tokens and health["enabled"]
    assert sum(fin.usage.cached_tokens for _, fin in results) == stats.hit_tokens
    for (_, fin), prompt in zip(results, prompts):
        assert fin.content == text_of(
            runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(prompt), 10)
        )
    assert stats.hit_tokens > 0
    assert stats.evictions > 0


@pytest.mark.asyncio
async def test_preempted_request_replays_from_its_cached_blocks(runtime):
    """Preemption at once, one lane: the paused request's committed blocks stay cached, its Replay
    finds them, and both outputs still equal greedy decoding alone."""
    long = SYSTEM + "Tell a long story."
    client = open_client(runtime, max_batch=1, max_len=256, preempt_after_s=0.0)
    try:
        (_, fin), (_, short) = await asyncio.gather(
            collect(client, text_request("long", long, greedy(40), runtime.name)),
            collect(client, text_request("short", "hi", greedy(4), runtime.name)))
        stats = client.engine.program.blocks.stats
        preempted = client.engine.metrics.preemptions._value.get()
    finally:
        await client.aclose()
    assert fin.content == text_of(
        runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode(long), 40)
    )
    assert short.content == text_of(
        runtime.domain, oracle_greedy(runtime, runtime.tokenizer.encode("hi"), 4)
    )
    assert preempted >= 1
    assert stats.hit_tokens >= BS * (len(long.encode()) // BS)
    assert fin.usage.cached_tokens == 0  # usage counts what the first admission found


@pytest.mark.gpu
@pytest.mark.asyncio
async def test_cuda_outputs_identical_with_and_without_the_cache():
    """The same check on CUDA: paged KV through the Triton kernels (write_kv, paged_attention),
    decode CUDA graphs reading the block tables at replay, float32; free, JSON Schema and choice
    requests from one cached prefix equal the engine without the cache, and the hits report their
    cached tokens."""
    import torch

    from bench.random_weights import random_runtime
    from tests.support.common import byte_domain

    runtime = random_runtime(byte_domain(), dtype=torch.float32, device="cuda", seed=1)
    results = {}
    for enabled in (False, True):
        client = open_client(
            runtime, max_batch=2, max_len=384, prefill_chunk=64, prefix_cache=enabled
        )
        try:
            results[enabled] = await _run_sequentially(
                client, _requests(runtime, f"g{int(enabled)}")
            )
        finally:
            await client.aclose()
    for (_, off), (_, on) in zip(results[False], results[True]):
        assert on.content == off.content and on.finish_reason == off.finish_reason
    assert [fin.usage.cached_tokens > 0 for _, fin in results[True]] == [False] + [True] * 5
