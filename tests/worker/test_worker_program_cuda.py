"""Program on CUDA: decode graphs per batch size, pinned mask buffers, the ready event."""

from __future__ import annotations

import asyncio
import importlib.util
import json

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
    until_warm,
)

pytestmark = pytest.mark.gpu

PROMPTS = ["Once upon a time", "x", "The quick brown fox jumps over the lazy dog.", "0123", "tiny"]
MAX_TOKENS = [12, 5, 20, 9, 16]


@pytest.mark.asyncio
@pytest.mark.parametrize("graphs", [True, False])
async def test_decode_graphs_equal_the_oracle(graphs):
    """Design: "one CUDA graph per batch size for decode ... On CPU the same Program runs
    eagerly." Batched decoding through replayed graphs (batches padded to the next captured size,
    padding rows on the scratch lane) equals engine-free greedy decoding of each request alone."""
    rt = tiny_runtime(device="cuda")
    client = open_client(rt, max_batch=3, max_len=128, prefill_chunk=8, cuda_graphs=graphs)
    try:
        results = await asyncio.gather(
            *(
                collect(client, text_request(f"r{i}", p, greedy(n), rt.name))
                for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))
            )
        )
        program = client.engine.program
        graphs = program.forward.graphs
        captured = list(graphs.captured) if graphs is not None else []
        ready = program._ready
    finally:
        await client.aclose()
    for (_, fin), p, n in zip(results, PROMPTS, MAX_TOKENS):
        assert fin.content == text_of(rt.domain, oracle_greedy(rt, rt.tokenizer.encode(p), n)), p
    if graphs:
        assert captured and set(captured) <= {1, 2, 3}
    else:
        assert captured == []
    if importlib.util.find_spec("cuda") is not None:
        assert ready._cudart is not None  # the ready event goes through cuda-python


@pytest.mark.asyncio
async def test_constrained_rows_on_cuda_are_schema_valid():
    """Constrained and unconstrained rows share graphs; masks are uploaded from the pinned host
    buffer (counted in the report) and every sampled JSON validates with `jsonschema`."""
    rt = tiny_runtime(device="cuda")
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "minimum": 0, "maximum": 99},
            "b": {"type": "boolean"},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    client = open_client(rt, max_batch=4, max_len=256)
    try:
        results = await asyncio.gather(
            *(collect(client, text_request(f"j{i}", f"json {i}", greedy(
                120, constraint=OutputConstraint.json_schema(schema)), rt.name)) for i in range(3)),
            collect(client, text_request("free", "free", greedy(30), rt.name)))
    finally:
        await client.aclose()
    stopped = [fin for _, fin in results[:3] if fin.finish_reason.value == "stop"]
    assert stopped
    for fin in stopped:
        jsonschema.validate(json.loads(fin.content), schema)
    for _, fin in results[:3]:
        assert fin.constraint["mask_upload_bytes"] > 0
    assert results[3][1].constraint is None


@pytest.mark.asyncio
async def test_pipeline_and_masked_sample_graph_publish_what_the_serial_engine_does():
    """On CUDA the Engine's pipeline (launch step n+1 before committing step n) and the decode
    graph's masked sample stage (constrained greedy rows sampled by a replayed graph on the
    static mask buffer) change nothing that is published: the same requests, float32 model (so
    the fused greedy kernel runs), give the same events with the pipeline off, on, and with the
    masked stage eager; the pipeline chained steps and the masked graph was replayed."""
    import torch

    from bench.random_weights import random_runtime
    from services.worker.program.graphs import DecodeGraph
    from tests.support.common import byte_domain

    rt = random_runtime(byte_domain(), dtype=torch.float32, device="cuda", seed=3)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}},
              "required": ["a", "b"]}
    replays = {"n": 0}
    original = DecodeGraph.sample_masked

    def counted(self, mask_row):
        replays["n"] += 1
        return original(self, mask_row)

    async def run(pipeline: bool, masked_graph: bool):
        client = open_client(rt, max_batch=4, max_len=160, pipeline=pipeline)
        if not masked_graph:  # the masked stage eager: no decode graph captures it
            type(client.engine.program.sampler).graph_masked = property(lambda s: False)
        try:
            requests = [text_request(f"j{i}", f"json {i}", greedy(
                60, constraint=OutputConstraint.json_schema(schema)), rt.name) for i in range(2)]
            requests += [text_request(f"f{i}", p, greedy(n), rt.name)
                         for i, (p, n) in enumerate(zip(PROMPTS, MAX_TOKENS))]
            results = await asyncio.gather(*(collect(client, r) for r in requests))
            chained = client.engine.pipeline.chained_steps
        finally:
            await client.aclose()
        return [(d, fin.content, fin.finish_reason, fin.usage) for d, fin in results], chained

    from services.worker.program.sampling import Sampler

    prop = Sampler.graph_masked
    try:
        DecodeGraph.sample_masked = counted
        serial, chained_serial = await run(False, True)
        piped, chained = await run(True, True)
        used = replays["n"]
        eager, _ = await run(True, False)
    finally:
        DecodeGraph.sample_masked = original
        Sampler.graph_masked = prop
    assert chained_serial == 0 and chained > 0
    assert used > 0
    assert piped == serial
    assert eager == serial


@pytest.mark.asyncio
async def test_reinstalling_a_proposer_keeps_the_captured_graphs():
    """A proposer installed again over the same Program (a bench's known-acceptance wrapper over
    the served one) reads what the first read, so the decode and verify graphs the warm-up
    captured stay: none is captured again on the request path."""
    rt = tiny_runtime(device="cuda")
    client = open_client(rt, max_batch=2, max_len=64, prefill_chunk=8, speculative="ngram",
                         num_draft_tokens=2, warmup=True)
    try:
        assert await until_warm(client) is not None
        program = client.engine.program
        decode, verify = program.forward.graphs, program.forward.verify_graphs
        captured = (decode.captured, verify.captured)
        assert captured[0] and captured[1]  # the warm-up captured both
        program.use(client.engine.proposer)
        assert program.forward.graphs is decode and program.forward.verify_graphs is verify
        assert (decode.captured, verify.captured) == captured
    finally:
        await client.aclose()
