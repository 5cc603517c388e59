"""Engine: continuous batching, lanes, KV reuse and chunked prefill against an engine-free
oracle."""

from __future__ import annotations

import asyncio

import pytest

from services.worker.runtime import SamplingDefaults, resolve_sampling
from shared.generation import RequestOptions, SamplingParams
from tests.support.worker_support import (
    collect,
    greedy,
    open_client,
    oracle_greedy,
    text_of,
    text_request,
    tiny_runtime,
)

PROMPTS = [
    "Once upon a time",
    "x",
    "The quick brown fox jumps over the lazy dog; the lazy dog sleeps on.",
    "0123456789 abcdefghij",
    "tiny",
    "Another fairly long prompt that needs several prefill chunks to fit in.",
]
MAX_TOKENS = [12, 5, 20, 9, 16, 7]


@pytest.fixture(scope="module")
def runtime():
    return tiny_runtime()


@pytest.mark.asyncio
async def test_continuous_batching_equals_each_request_alone(runtime):
    """Design: "Lanes: a fixed number of resident lanes ... Requests wait in a queue for a free
    lane"; each row's result follows only its own committed prefix. Six requests of different
    lengths through 3 lanes (joining as others leave, prefill chunks of 8 interleaved with decode)
    must each equal greedy decoding of that request alone, computed without the engine."""
    client = open_client(runtime, max_batch=3, max_len=160, prefill_chunk=8)
    try:
        requests = [text_request(f"r{i}", p, greedy(n), runtime.name)
                    for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
        results = await asyncio.gather(*(collect(client, r) for r in requests))
        steps = client.engine.steps
    finally:
        await client.aclose()
    for (deltas, fin), prompt, n in zip(results, PROMPTS, MAX_TOKENS):
        ids = runtime.tokenizer.encode(prompt)
        expected = oracle_greedy(runtime, ids, n)
        assert fin.content == text_of(runtime.domain, expected), prompt
        assert "".join(deltas) == fin.content
        assert fin.usage.completion_tokens == len(expected)
        assert fin.usage.prompt_tokens == len(ids)
        assert fin.finish_reason.value == ("stop" if expected[-1] in runtime.domain.eos_ids
                                           else "length")
        assert fin.constraint is None
    # Batching really happened: fewer steps than running the requests one after another.
    alone = sum(
        -(-len(runtime.tokenizer.encode(p)) // 8) + n - 1 for p, n in zip(PROMPTS, MAX_TOKENS)
    )
    assert steps < alone


@pytest.mark.asyncio
@pytest.mark.parametrize("chunk", [3, 1000])
async def test_chunked_prefill_equals_unchunked(runtime, chunk):
    """Design: "Intermediate prefill chunk: no output, no mask, no matcher progress". A prompt
    prefilled in chunks of 3 tokens and in one piece yields the oracle's greedy output."""
    prompt = PROMPTS[2]
    client = open_client(runtime, max_batch=2, max_len=128, prefill_chunk=chunk)
    try:
        _, fin = await collect(client, text_request("c", prompt, greedy(10), runtime.name))
    finally:
        await client.aclose()
    expected = oracle_greedy(runtime, runtime.tokenizer.encode(prompt), 10)
    assert fin.content == text_of(runtime.domain, expected)


@pytest.mark.asyncio
async def test_seeded_sampling_does_not_depend_on_the_batch(runtime):
    """Design: "The RNG split by seed, logical position and purpose continues, and a changing
    compact row never resets a request's random stream." The same seeded request alone and among
    other requests samples the same output."""
    opts = RequestOptions(max_tokens=15, sampling=SamplingParams(temperature=1.0, seed=7))
    client = open_client(runtime, max_batch=4, max_len=128, prefill_chunk=16)
    try:
        _, alone = await collect(client, text_request("s0", "seeded", opts, runtime.name))
        others = [
            text_request(f"o{i}", p, greedy(8), runtime.name) for i, p in enumerate(PROMPTS[:3])
        ]
        together = await asyncio.gather(
            *(collect(client, r) for r in others),
            collect(client, text_request("s1", "seeded", opts, runtime.name)))
        _, other_seed = await collect(client, text_request(
            "s2", "seeded", RequestOptions(max_tokens=15, sampling=SamplingParams(seed=8)),
            runtime.name))
    finally:
        await client.aclose()
    assert together[-1][1].content == alone.content
    assert other_seed.content != alone.content


@pytest.mark.asyncio
async def test_caller_penalties_apply(runtime):
    """Design: "Penalties the caller sets still apply." Greedy decoding with a frequency and a
    presence penalty equals the oracle that subtracts them from the logits of output tokens."""
    prompt, n = PROMPTS[0], 20
    opts = RequestOptions(max_tokens=n, sampling=SamplingParams(
        temperature=0.0, presence_penalty=0.5, frequency_penalty=1.5))
    client = open_client(runtime, max_batch=2, max_len=128)
    try:
        _, fin = await collect(client, text_request("p", prompt, opts, runtime.name))
    finally:
        await client.aclose()
    ids = runtime.tokenizer.encode(prompt)
    expected = oracle_greedy(runtime, ids, n, presence=0.5, frequency=1.5)
    assert fin.content == text_of(runtime.domain, expected)
    assert expected != oracle_greedy(runtime, ids, n)  # the penalties changed something


def test_resolve_sampling_drops_model_penalties_for_constrained_requests():
    """Design: "The Engine resolves a content-constrained request without the model's registered
    penalties ... Penalties the caller sets still apply." """
    preset = SamplingDefaults(presence_penalty=1.5, repetition_penalty=1.1)
    plain = SamplingParams(temperature=0.7)
    assert resolve_sampling(plain, preset, constrained=False).presence_penalty == 1.5
    assert resolve_sampling(plain, preset, constrained=False).repetition_penalty == 1.1
    assert resolve_sampling(plain, preset, constrained=True).presence_penalty == 0.0
    assert resolve_sampling(plain, preset, constrained=True).repetition_penalty == 1.0
    caller = SamplingParams(temperature=0.7, presence_penalty=0.3)
    assert resolve_sampling(caller, preset, constrained=True).presence_penalty == 0.3
    assert resolve_sampling(caller, preset, constrained=False).presence_penalty == 0.3
    assert resolve_sampling(caller, preset, constrained=False).repetition_penalty == 1.1
