"""The built-in model's CPU decode on the GGUF's Q4_1 / Q8_0 blocks (kernels/cpu_gemv.py) against
the float32 path it replaces (F.linear on the dequantised weights), in one process."""

from __future__ import annotations

import asyncio

import pytest
import torch

from kernels import cpu_gemv
from kernels.cpu_gemv import QuantizedMatrix
from services.worker.models import layers
from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.generation import ChatMessage, GenerateRequest, PromptInput
from tests.support.worker_support import collect, greedy, open_client

pytestmark = pytest.mark.skipif(not cpu_gemv.available(),
                                reason=f"CPU GEMV unavailable: {cpu_gemv.unavailable_reason()}")

QUESTIONS = ("What is the capital of France?", "Write a haiku about the sea.",
             "List three prime numbers.", "Explain what a CPU cache is in one sentence.")
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"},
                                           "population": {"type": "integer"}},
          "required": ["city", "population"], "additionalProperties": False}


@pytest.fixture(scope="module")
def runtime():
    return load_runtime()


def generate(runtime, constraint, max_batch: int):
    async def run():
        client = open_client(runtime, max_batch=max_batch, max_len=256)
        try:
            return await asyncio.gather(*(
                collect(client, GenerateRequest(
                    f"r{i}", PromptInput(messages=(ChatMessage("user", q),)),
                    greedy(24, constraint=constraint)))
                for i, q in enumerate(QUESTIONS)))
        finally:
            await client.aclose()

    return [(deltas, done.finish_reason, done.usage.completion_tokens)
            for deltas, done in asyncio.run(run())]


@pytest.mark.parametrize("constrained", [False, True], ids=["unconstrained", "json_schema"])
def test_greedy_outputs_equal_the_float32_path(runtime, monkeypatch, constrained):
    """Greedy decoding is unchanged by reading the checkpoint's blocks instead of their float32
    dequantisation (the same weights; only the GEMV's summation order differs): every streamed
    delta, finish reason and token count equal, with and without a JSON Schema, four requests
    batched (decode rows 4 down to fewer as they finish). The new path must really run: the
    kernel is called on the four decode rows."""
    constraint = OutputConstraint.json_schema(SCHEMA) if constrained else None
    monkeypatch.setattr(layers, "CPU_GEMV", False)
    expected = generate(runtime, constraint, max_batch=4)
    calls = []
    original = QuantizedMatrix.linear

    def counted(self, x, bias=None):
        calls.append(x.shape)
        return original(self, x, bias)

    monkeypatch.setattr(layers, "CPU_GEMV", True)
    monkeypatch.setattr(QuantizedMatrix, "linear", counted)
    assert generate(runtime, constraint, max_batch=4) == expected
    assert 4 in {shape[0] for shape in calls}, "the CPU GEMV did not run on the decode rows"
    assert all(d for d, _, _ in expected)


def test_loader_attaches_blocks_equal_to_the_float32_weights(runtime):
    """Each fused GEMM's block matrix dequantises to exactly the float32 matrix the model holds
    (q|k|v with the loader's Q/K row order, gate|up, o, down, the tied output)."""
    model = runtime.model
    layer = model.model.layers[0]
    pairs = [(layer.self_attn.quantized["qkv"], layer.self_attn.fused_q_proj),
             (layer.self_attn.quantized["o_proj"], layer.self_attn.o_proj.weight),
             (layer.mlp.quantized["gate_up"], layer.mlp.fused_gate_proj),
             (layer.mlp.quantized["down_proj"], layer.mlp.down_proj.weight),
             (model.quantized_output, model.output_weight)]
    for matrix, weight in pairs:
        assert torch.equal(matrix.dequantize().view(torch.int32), weight.view(torch.int32))
    assert all(m is not None for layer in model.model.layers
               for m in (*layer.self_attn.quantized.values(), *layer.mlp.quantized.values()))
