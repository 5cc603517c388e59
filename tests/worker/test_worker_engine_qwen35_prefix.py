"""The hybrid model's prefix cache at shared prefixes: recurrent-state snapshots taken inside
prefill forwards (models/gdn.py cuts, program/snapshots.py policy) on a tiny random Qwen3.5.

Issue: "GDN recurrent and convolution state snapshots fine-grained enough that a new prompt
sharing a prefix with an earlier one hits close to the shared length ... at any prompt length;
... outputs with and without the cache are identical (greedy, and seeded sampling), constrained
or not"; target: "the same system prompt (300 ...) with a new question: cached tokens >= 90% of
the shared prefix"; "CPU tests prove cache exactness for the hybrid model (outputs equal with and
without the cache, across chunk sizes and partial hits)". Float64 weights keep the arithmetic of
different chunkings far below any sampling tie.
"""

from __future__ import annotations

import pytest
import torch

from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.generation import (
    ChatMessage,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
)
from tests.support.qwen35_support import assert_close, hf_causal_lm
from tests.support.worker_support import collect, greedy, open_client

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
         "juliett", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
         "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu")
SYSTEM = "You are a careful assistant. Rules: " + " ".join(
    f"{WORDS[i % 26]}-{i}" for i in range(60))  # ~300 tokens rendered
SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
          "additionalProperties": False}


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35-prefix")
    hf_causal_lm(seed=5, max_position_embeddings=1024).save_pretrained(str(path))
    return load_runtime(str(path), dtype=torch.float64)


def _chat(request_id: str, question: str, options: RequestOptions, model: str) -> GenerateRequest:
    messages = (ChatMessage("system", SYSTEM), ChatMessage("user", question))
    return GenerateRequest(request_id, PromptInput(messages=messages, enable_thinking=False),
                           options, model=model)


def _requests(model: str) -> list[GenerateRequest]:
    seeded = RequestOptions(max_tokens=6, sampling=SamplingParams(temperature=0.9, seed=11))
    return [_chat("q1", "What is the first rule?", greedy(6), model),
            _chat("q2", "Name two rules, please.", greedy(6), model),
            _chat("q2-again", "Name two rules, please.", greedy(6), model),
            _chat("seeded", "Pick any rule at random.", seeded, model),
            _chat("json", "Answer in JSON.", greedy(
                8, constraint=OutputConstraint.json_schema(SCHEMA)), model)]


async def _serve(runtime, *, prefix_cache: bool, prefill_chunk: int):
    client = open_client(runtime, max_batch=1, max_len=512, prefill_chunk=prefill_chunk,
                         prefix_cache=prefix_cache)
    try:
        return [await collect(client, r) for r in _requests(runtime.name)]
    finally:
        await client.aclose()


def _shared(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


@pytest.mark.asyncio
async def test_shared_system_prompt_hits_and_outputs_equal_the_uncached_ones(runtime):
    """Across chunk sizes (the per-token recurrence, the chunked form, the whole prompt in one
    forward): a new question after the same ~300-token system prompt finds >= 90% of the shared
    prefix cached, an exact repeat its last full block, and every output (greedy, seeded, JSON
    Schema) equals the one served without the cache."""
    ids = [runtime.prepare(r.prompt).token_ids for r in _requests(runtime.name)]
    shared = _shared(ids[0], ids[1])
    assert shared >= 250, shared  # a ~300-token system prompt: the case the target names
    off = await _serve(runtime, prefix_cache=False, prefill_chunk=512)
    assert all(fin.usage.cached_tokens == 0 for _, fin in off)
    for chunk in (24, 100, 512):
        on = await _serve(runtime, prefix_cache=True, prefill_chunk=chunk)
        cached = [fin.usage.cached_tokens for _, fin in on]
        assert cached[0] == 0
        for i in (1, 3, 4):
            assert cached[i] >= 0.9 * _shared(ids[0], ids[i]), (chunk, i, cached)
        assert cached[2] == (len(ids[2]) - 1) // 16 * 16, (chunk, cached)  # the exact repeat
        for (_, a), (_, b), r in zip(on, off, _requests(runtime.name)):
            assert a.content == b.content, (chunk, r.request_id)
            assert a.usage.completion_tokens == b.usage.completion_tokens


def test_cut_states_equal_the_state_after_feeding_the_prefix_alone(runtime):
    """A forward with cuts writes into each slot the recurrent state and conv window the row has
    after that many tokens (as a forward of only those tokens leaves them), and its logits equal
    those of the same forward without cuts (the recurrent state is float32: within its rounding;
    the first layer's conv window, a copy of inputs before any recurrence, to float64's)."""
    model = runtime.model
    gen = torch.Generator().manual_seed(0)
    T, cuts = 70, ((0, 16, 0), (0, 48, 1), (1, 32, 2), (1, 50, 3))
    tokens = torch.randint(0, 5000, (2, T), generator=gen)
    counts = torch.tensor([T, 50])  # the second row right-padded after 50 tokens
    positions = torch.arange(T)[None].expand(2, T)
    lanes = torch.tensor([0, 1])

    def run(cut):
        state = model.new_state(4, 128, dtype=torch.float64, device="cpu")
        state.allocate_snapshots(4)
        if cut:
            state.cut_next(cuts)
        with torch.no_grad():
            z = model(tokens, positions, state, lanes, num_tokens=counts)
        return state, z

    state, with_cuts = run(True)
    _, without = run(False)
    # (the recurrent state is float32 whatever the weights: segments round differently)
    assert_close(with_cuts[0], without[0], 1e-5, "row 0")
    assert_close(with_cuts[1, :50], without[1, :50], 1e-5, "row 1")
    for row, t, slot in cuts:
        alone = model.new_state(1, 128, dtype=torch.float64, device="cpu")
        with torch.no_grad():
            model(tokens[row:row + 1, :t], positions[:1, :t], alone, torch.tensor([0]))
        alone.commit(torch.tensor([0]), torch.tensor([t]))
        committed = int(alone.slot[0])
        assert_close(state.snap_ssm[:, slot], alone.ssm[:, committed], 1e-5, f"{row}@{t}")
        # the first GDN layer's conv inputs come before any recurrence: float64 close
        torch.testing.assert_close(state.snap_conv[0, slot], alone.conv[0, committed],
                                   rtol=1e-12, atol=1e-12)
        assert_close(state.snap_conv[:, slot], alone.conv[:, committed], 1e-5, f"{row}@{t}")


def test_bench_prefix_chat_finds_most_of_each_shared_system_prompt(runtime):
    """`infernix bench prefix --chat` (the H200 measures the target with it): every hit, the
    first one after each cold request included, reports >= 90% of the tokens it shares with the
    cold prompt as cached."""
    import argparse
    import asyncio

    from bench.prefix import _rounds

    args = argparse.Namespace(prefix_tokens=300, repeats=2, hits=2, max_tokens=3,
                              prefill_chunk=512, chat=True)
    report = asyncio.run(_rounds(runtime, args, lambda line: None))
    assert [c["cached_tokens"] for c in report["cold"]] == [0, 0]
    assert len(report["hits"]) == 4 and all(h["shared_tokens"] >= 280 for h in report["hits"])
    assert report["targets"]["cached_ge_90pct_of_shared"], report["hits"]
    assert report["cached_over_shared_min"] >= 0.9


@pytest.mark.asyncio
async def test_concurrent_prompts_sharing_a_system_prompt_equal_the_uncached_outputs(runtime):
    """Two lanes prefill the same system prompt at once (their forwards cut at the same
    boundaries; one snapshot is kept per boundary), then later questions hit (usage and metrics
    say so); every output equals the cache-off one."""
    import asyncio

    questions = ("First?", "Second?", "Third?", "Fourth?")
    outs = {}
    for enabled in (True, False):
        client = open_client(runtime, max_batch=2, max_len=512, prefill_chunk=64,
                             prefix_cache=enabled)
        try:
            reqs = [_chat(f"c{i}", q, greedy(5), runtime.name) for i, q in enumerate(questions)]
            first = await asyncio.gather(*(collect(client, r) for r in reqs[:2]))
            later = await asyncio.gather(*(collect(client, r) for r in reqs[2:]))
            outs[enabled] = first + later
            metrics = client.engine.metrics  # the hit and the snapshots show in the metrics
            assert (metrics.state_snapshots._value.get() > 0) == enabled
            assert (metrics.prefix_hit_tokens._value.get() >= 512) == enabled
        finally:
            await client.aclose()
    assert all(fin.usage.cached_tokens >= 256 for _, fin in outs[True][2:])
    for (_, a), (_, b) in zip(outs[True], outs[False]):
        assert a.content == b.content
