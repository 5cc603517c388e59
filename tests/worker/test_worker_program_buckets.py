"""Prefill widths padded to a finite set (program/buckets.py) are exact: outputs with and without
bucketing are equal, on a dense model and on the hybrid Qwen3.5 one (its recurrence and the
prefix cache's state snapshots inside prefill forwards included).

Issue: "every kernel shape the server can meet (prefill lengths, batch sizes, ...) is compiled,
bucketed or cached on disk at start-up"; brief: "pad each prefill forward's token count to a
bucket ... where padding is exact (masked/ignored positions must not change any output: prove it
with a CPU test that outputs are equal with and without bucketing)".
"""

from __future__ import annotations

import pytest
import torch

from services.worker.program.buckets import (
    EXACT_WIDTHS,
    PREFILL_STEP,
    prefill_width,
    prefill_widths,
)
from services.worker.runtime import load_runtime
from shared.generation import GenerateRequest, PromptInput, RequestOptions, SamplingParams
from tests.support.qwen35_support import hf_causal_lm
from tests.support.worker_support import collect, greedy, hooked, open_client, tiny_runtime


def test_widths_are_padded_into_the_finite_set_and_never_past_the_lane():
    """Up to EXACT_WIDTHS a width is its own bucket (the per-token recurrence route); above, the
    next multiple of PREFILL_STEP; every padded width of a chunk lies in `prefill_widths`, the
    set the warm-up visits (where it would leave the lane, `plan_widths` splits: tests below)."""
    max_len, chunk = 1000, 300
    widths = set(prefill_widths(chunk, max_len))
    for w in range(1, chunk + 1):
        p = prefill_width(w)
        assert p in widths and p >= w
        if w <= EXACT_WIDTHS:
            assert p == w
        else:
            assert p % PREFILL_STEP == 0 and p - w < PREFILL_STEP
    assert len(widths) == EXACT_WIDTHS + -(-chunk // PREFILL_STEP)


def _prompts(runtime, n: int) -> list[GenerateRequest]:
    # Raw prompts of odd lengths (tens to ~130 tokens): widths between the buckets.
    gen = torch.Generator().manual_seed(3)
    words = ("alpha", "bravo", "kilo", "zulu", "tango", "echo", "x", "yy")
    out = []
    for i, count in enumerate((13, 22, 9, 31, 27)[:n]):
        picks = torch.randint(0, len(words), (count,), generator=gen).tolist()
        prompt = PromptInput(text=" ".join(words[j] for j in picks))
        seeded = RequestOptions(max_tokens=8, sampling=SamplingParams(temperature=0.9, seed=i))
        out.append(GenerateRequest(f"r{i}", prompt, seeded if i % 2 else greedy(8),
                                   model=runtime.name))
    return out


async def _serve(runtime, requests, *, bucketed: bool, later=(), **config):
    # `later`: requests sent one by one after `requests` all finished (a prefix hit is then
    # certain, not a matter of which request was admitted first)
    hooked_runtime, model = hooked(runtime)
    widths: list[int] = []
    model.before = lambda tokens, positions, lanes: widths.append(tokens.shape[1])
    client = open_client(hooked_runtime, **config)
    client.engine.program.forward.bucketed = bucketed
    try:
        import asyncio

        results = await asyncio.gather(*(collect(client, r) for r in requests))
        for r in later:
            results.append(await collect(client, r))
    finally:
        await client.aclose()
    return [fin for _, fin in results], widths


@pytest.mark.asyncio
async def test_dense_outputs_equal_with_and_without_bucketing():
    """Greedy and seeded outputs of prompts of odd lengths, prefilled together in chunks, are the
    same with padded prefill widths as without; and the padding happened (widths of 64)."""
    runtime = tiny_runtime()
    requests = _prompts(runtime, 5)
    config = {"max_batch": 3, "max_len": 256, "prefill_chunk": 100}
    plain, plain_widths = await _serve(runtime, requests, bucketed=False, **config)
    padded, padded_widths = await _serve(runtime, requests, bucketed=True, **config)
    assert all(w % PREFILL_STEP == 0 or w <= EXACT_WIDTHS for w in padded_widths), padded_widths
    assert any(w % PREFILL_STEP for w in plain_widths if w > EXACT_WIDTHS), plain_widths
    for a, b in zip(plain, padded):
        assert a.error is None and b.error is None
        assert a.content == b.content and a.usage.completion_tokens == b.usage.completion_tokens


@pytest.fixture(scope="module")
def qwen35(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35-buckets")
    hf_causal_lm(seed=7, max_position_embeddings=1024).save_pretrained(str(path))
    return load_runtime(str(path), dtype=torch.float64)


@pytest.mark.asyncio
@pytest.mark.parametrize("prefix_cache", [False, True])
async def test_hybrid_outputs_equal_with_and_without_bucketing(qwen35, prefix_cache):
    """On Qwen3.5 (chunked gated delta rule over padded tokens with g = beta = 0; with the prefix
    cache, state snapshots cut inside the padded forwards) the outputs are the same too."""
    requests = _prompts(qwen35, 4)
    again = [requests[1].__class__("again", requests[1].prompt, requests[1].options,
                                   model=qwen35.name)]  # a prefix hit when cached
    config = {"max_batch": 2, "max_len": 512, "prefill_chunk": 96,
              "prefix_cache": prefix_cache}
    plain, _ = await _serve(qwen35, requests, bucketed=False, later=again, **config)
    padded, widths = await _serve(qwen35, requests, bucketed=True, later=again, **config)
    assert (plain[-1].usage.cached_tokens > 0) == prefix_cache
    assert any(w > EXACT_WIDTHS and w % PREFILL_STEP == 0 for w in widths), widths
    for a, b in zip(plain, padded):
        assert a.error is None and b.error is None
        assert a.content == b.content and a.usage.completion_tokens == b.usage.completion_tokens
        assert a.usage.cached_tokens == b.usage.cached_tokens
