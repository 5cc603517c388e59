"""The hybrid Qwen3.5 model through the whole worker: a saved random-weight checkpoint (no
tokenizer files: the built-in Qwen3.5 vocabulary) served by the Engine with continuous batching,
chunked prefill, preemption and JSON Schema constraints.

Issue 16 §2: "Chunked prefill, continuous batching, cancellation and per-row failures work exactly
as for dense models"; §3: the checkpoint served end to end "with JSON Schema constraints (outputs
schema-valid; no claims about quality)". Independent basis: greedy decoding with transformers'
Qwen3_5ForCausalLM on the same weights (whole sequence, no cache), never-generable ids excluded.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest
import torch

from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from tests.support.qwen35_support import hf_causal_lm
from tests.support.worker_support import collect, greedy, open_client, text_of, text_request

PROMPTS = ("The capital of France is", "1, 2, 3,", "<|im_start|>user\nhi<|im_end|>\n")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen35")
    hf = hf_causal_lm(seed=3)
    hf.save_pretrained(str(path))
    return hf, load_runtime(str(path))


def _oracle(hf, runtime, prompt: str, n: int) -> str:
    domain = runtime.domain
    ids = list(runtime.prepare(text_request("x", prompt, greedy(1), runtime.name).prompt).token_ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            z = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()
            z[len(domain.token_bytes):] = float("-inf")
            for t in domain.never_ids:
                z[t] = float("-inf")
            t = int(torch.argmax(z))
            out.append(t)
            if t in domain.eos_ids:
                break
            ids.append(t)
    return text_of(domain, out)


@pytest.mark.asyncio
async def test_batched_chunked_and_preempted_generation_equals_transformers(served):
    """Three prompts through two lanes with a 5-token prefill budget and preemption at once:
    every output equals transformers' greedy output of that prompt alone (the recurrent state of
    each lane is reset at a new request's first position, restored by Replay after a pause, and
    never advanced by a padded or uncommitted position)."""
    hf, runtime = served
    client = open_client(runtime, max_batch=2, max_len=128, prefill_chunk=5, preempt_after_s=0.0)
    try:
        results = await asyncio.gather(
            *(
                collect(client, text_request(f"r{i}", p, greedy(8), runtime.name))
                for i, p in enumerate(PROMPTS)
            )
        )
        preempted = client.engine.metrics.preemptions._value.get()
    finally:
        await client.aclose()
    assert preempted >= 1
    for (deltas, fin), prompt in zip(results, PROMPTS):
        assert fin.content == "".join(deltas) == _oracle(hf, runtime, prompt, 8), prompt


@pytest.mark.asyncio
async def test_json_schema_output_is_valid(served):
    _, runtime = served
    schema = {
        "type": "object",
        "properties": {
            "ok": {"type": "boolean"},
            "n": {"type": "integer", "minimum": 0, "maximum": 9},
        },
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    client = open_client(runtime, max_batch=2, max_len=256)
    try:
        outs = await asyncio.gather(*(collect(client, text_request(
            f"j{i}", "JSON: ", greedy(120, constraint=OutputConstraint.json_schema(schema)),
            runtime.name)) for i in range(2)))
    finally:
        await client.aclose()
    for _, fin in outs:
        assert fin.constraint is not None
        if fin.finish_reason.value == "stop":
            jsonschema.validate(json.loads(fin.content), schema)
        else:  # cut by the limit: an incomplete prefix, never an invalid completion
            assert fin.finish_reason.value == "length" and not fin.constraint["complete"]


@pytest.mark.asyncio
async def test_prefix_cache_resumes_the_recurrent_state_at_a_cached_boundary(served):
    """Issue 13: "the recurrent GDN state is cached at block boundaries beside the KV of the
    attention layers (a hit resumes from the state at the last cached boundary)". The same long
    prompt twice, and a second prompt sharing its first part, with the cache on: the repeats find
    cached blocks (their usage says so) and every output equals transformers' greedy output; the
    cache off gives the same outputs and no cached tokens."""
    hf, runtime = served
    base = "<|im_start|>system\nYou answer briefly and exactly, one line only.<|im_end|>\n"
    prompts = (base + "<|im_start|>user\ncount to five<|im_end|>\n",
               base + "<|im_start|>user\ncount to five<|im_end|>\n",
               base + "<|im_start|>user\nname a colour<|im_end|>\n")
    outs = {}
    for enabled in (True, False):
        client = open_client(
            runtime, max_batch=1, max_len=160, prefill_chunk=7, prefix_cache=enabled
        )
        try:
            outs[enabled] = [
                await collect(client, text_request(f"p{i}", p, greedy(6), runtime.name))
                for i, p in enumerate(prompts)
            ]
        finally:
            await client.aclose()
    cached = [fin.usage.cached_tokens for _, fin in outs[True]]
    n = len(
        runtime.prepare(text_request("x", prompts[0], greedy(1), runtime.name).prompt).token_ids
    )
    assert cached[0] == 0 and cached[1] == (n - 1) // 16 * 16 > 0
    assert [fin.usage.cached_tokens for _, fin in outs[False]] == [0, 0, 0]
    for (_, on), (_, off), prompt in zip(outs[True], outs[False], prompts):
        assert on.content == off.content == _oracle(hf, runtime, prompt, 6), prompt
