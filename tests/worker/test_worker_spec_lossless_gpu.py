"""Lossless greedy speculation in bf16 on CUDA (models/layers.py WIDTH_INVARIANT): with the
width-invariant route on, a verify forward of K+1 tokens computes each position's logits with the
bits a decode step at that position computes, so at temperature 0 every proposer (n-gram, an
oracle that is always right, MTP), constrained or not, with or without CUDA graphs, gives the
tokens of plain greedy decoding token for token; and a request's plain greedy tokens do not depend
on the requests batched beside it. Small random models of the real architectures' head layouts
(head_dim 128 with 4 query heads per KV head; Qwen3.5's GDN and gated attention of head_dim 256)
in bf16, where the two routes' roundings differ without the flag."""

from __future__ import annotations

import asyncio

import pytest
import torch

from bench.oracle import OracleProposer
from bench.random_weights import ByteTokenizer, random_qwen3_runtime, random_qwen35
from bench.width_invariance import TINY_DENSE, TINY_QWEN35
from services.worker.models import layers
from services.worker.runtime import ModelRuntime
from services.worker.spec import ContextProposer
from shared.contract import OutputConstraint
from shared.frontends.frontend import Frontend
from tests.support.common import byte_domain
from tests.support.worker_support import greedy
from tests.worker.test_worker_spec_gpu import _run, _same

pytestmark = pytest.mark.gpu

LONG = "the quick brown fox jumps over the lazy dog; " * 4  # contexts past one 64-position tile
CASES = [("a", "hello hello hello " + LONG, greedy(32)),
         ("b", "abab", greedy(32, constraint=OutputConstraint.regex("(ab|cd)+x"))),
         ("c", LONG + "json", greedy(32, constraint=OutputConstraint.json_schema(
             {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})))]
MAX_LEN = 1024  # several context splits per query (kernels/paged_attention.py choose_splits)


@pytest.fixture(autouse=True)
def invariant(monkeypatch):
    monkeypatch.setattr(layers, "WIDTH_INVARIANT", True)


@pytest.fixture(scope="module")
def dense():
    d = byte_domain()
    return random_qwen3_runtime(d, ByteTokenizer(d), name="q3-tiny-bf16", shape=TINY_DENSE,
                                seed=3, dtype=torch.bfloat16, device="cuda")


@pytest.fixture(scope="module")
def hybrid():
    d = byte_domain()
    model = random_qwen35(dtype=torch.bfloat16, device="cuda", vocab_size=d.size, mtp=True,
                          seed=3, **TINY_QWEN35)
    return ModelRuntime("q35-tiny-bf16", model, model.config,
                        Frontend("q35-tiny-bf16", d, ByteTokenizer(d)))


def _oracle(runtime) -> tuple[list, OracleProposer]:
    record: dict = {}
    base, _ = asyncio.run(_run(runtime, CASES, record=record, max_len=MAX_LEN))
    oracle = OracleProposer()
    for seq in record.values():
        oracle.record(seq)
    return base, oracle


@pytest.mark.parametrize("graphs", [True, False])
def test_dense_bf16_ngram_and_oracle_equal_plain_greedy(dense, graphs):
    base, oracle = _oracle(dense)
    fins, _ = asyncio.run(_run(dense, CASES, max_len=MAX_LEN, speculative="ngram",
                               num_draft_tokens=3, cuda_graphs=graphs))
    _same(fins, base)
    fins, engine = asyncio.run(_run(dense, CASES, max_len=MAX_LEN, speculative="ngram",
                                    num_draft_tokens=4, cuda_graphs=graphs,
                                    wrap=lambda e: ContextProposer(oracle, 4)))
    _same(fins, base)
    assert engine.speculation.accepted > 0


@pytest.mark.parametrize("graphs", [True, False])
def test_qwen35_bf16_mtp_and_oracle_equal_plain_greedy(hybrid, graphs):
    base, oracle = _oracle(hybrid)
    fins, engine = asyncio.run(_run(hybrid, CASES, max_len=MAX_LEN, speculative="mtp",
                                    num_draft_tokens=3, cuda_graphs=graphs))
    _same(fins, base)
    assert engine.speculation.rounds > 0
    fins, engine = asyncio.run(_run(hybrid, CASES, max_len=MAX_LEN, speculative="ngram",
                                    num_draft_tokens=3, cuda_graphs=graphs,
                                    wrap=lambda e: ContextProposer(oracle, 3)))
    _same(fins, base)
    assert engine.speculation.accepted > 0


@pytest.mark.parametrize("which", ["dense", "hybrid"])
def test_bf16_plain_greedy_does_not_depend_on_the_batch(which, request):
    runtime = request.getfixturevalue(which)
    together, _ = asyncio.run(_run(runtime, CASES, max_len=MAX_LEN))
    for case, want in zip(CASES, together):
        alone, _ = asyncio.run(_run(runtime, [case], max_len=MAX_LEN))
        _same(alone, [want])
