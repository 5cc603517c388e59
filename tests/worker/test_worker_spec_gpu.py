"""Speculative decoding on CUDA: the Triton acceptance kernel (kernels/acceptance.py) behind the
verify stage, pinned K+1 mask buffers uploaded on the compute stream, decode graphs for ordinary
steps beside eager verify rounds (the host-launched route). Same independent basis as the CPU
tests: greedy outputs of the same engine without speculation, token for token."""

from __future__ import annotations

import asyncio
import re

import pytest
import torch

from bench.oracle import OracleProposer
from bench.random_weights import ByteTokenizer, random_qwen35
from services.worker.runtime import ModelRuntime
from services.worker.spec import ContextProposer
from shared.contract import OutputConstraint
from shared.frontends.frontend import Frontend
from shared.generation import RequestOptions, SamplingParams
from tests.support.common import byte_domain
from tests.support.worker_support import collect, greedy, open_client, text_request, tiny_runtime
from tests.worker.test_worker_spec_dflash import write_checkpoint
from tests.worker.test_worker_spec_mtp import SHAPE

pytestmark = pytest.mark.gpu

CASES = [("a", "hello hello hello", greedy(24)),
         ("b", "abab", greedy(24, constraint=OutputConstraint.regex("(ab|cd)+x"))),
         ("c", "json", greedy(24, constraint=OutputConstraint.json_schema(
             {"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})))]


async def _run(runtime, cases=CASES, *, record=None, wrap=None, max_len=128, **config):
    client = open_client(runtime, max_batch=3, max_len=max_len, prefill_chunk=8, **config)
    if wrap is not None:
        client.engine.proposer = wrap(client.engine)
    if record is not None:
        client.engine.finish_listeners.append(
            lambda job: record.__setitem__(job.request_id, job.prompt_ids + tuple(job.output_ids)))
    try:
        results = await asyncio.gather(*(collect(client, text_request(r, p, o, runtime.name))
                                         for r, p, o in cases))
        return [fin for _, fin in results], client.engine
    finally:
        program = client.engine.program  # what was captured, read before close() frees it
        program.captured_sizes = {name: graphs.captured for name, graphs in (
            ("decode", program.forward.graphs), ("verify", program.forward.verify_graphs),
            ("dflash", program.rounds.graphs)) if graphs is not None}
        await client.aclose()


def _same(fins, base):
    for got, want in zip(fins, base):
        assert got.error is None, got.error
        assert (got.content, got.usage.completion_tokens) == (
            want.content,
            want.usage.completion_tokens,
        )


@pytest.fixture(scope="module")
def dense():
    return tiny_runtime(device="cuda")


def test_ngram_and_oracle_on_cuda_equal_ordinary_greedy(dense):
    record: dict = {}
    base, _ = asyncio.run(_run(dense, record=record))
    oracle = OracleProposer()
    for seq in record.values():
        oracle.record(seq)
    fins, engine = asyncio.run(_run(dense, speculative="ngram", num_draft_tokens=3))
    _same(fins, base)
    for graphs in (True, False):  # the verify forward replayed per padded size, or eager
        fins, engine = asyncio.run(_run(dense, speculative="ngram", num_draft_tokens=4,
                                        cuda_graphs=graphs,
                                        wrap=lambda e: ContextProposer(oracle, 4)))
        _same(fins, base)
        assert engine.speculation.accepted > 0
        assert fins[1].constraint["mask_upload_bytes"] > 0
        assert bool(engine.program.captured_sizes.get("verify")) == graphs


@pytest.mark.parametrize("kind,graphs", [("dflash", True), ("dflash", False),
                                         ("dflash2", True)])
def test_draft_models_on_cuda_equal_ordinary_greedy(dense, kind, graphs, tmp_path):
    """DFlash's Forward phase captured per padded batch size (draft block, D2H of the ids,
    external event record, target forward) or eager; DFlash2 always eager."""
    write_checkpoint(tmp_path, dense, dflash2=kind == "dflash2")
    base, _ = asyncio.run(_run(dense))
    fins, engine = asyncio.run(_run(dense, speculative=kind, draft_model=str(tmp_path),
                                    num_draft_tokens=4, cuda_graphs=graphs))
    _same(fins, base)
    assert engine.speculation.rounds > 0 and engine.program.draft_wait_seconds > 0
    assert bool(engine.program.captured_sizes.get("dflash")) == (graphs and kind == "dflash")


def test_external_event_record_inside_capture_only():
    """The design's verified recipe: inside `torch.cuda.graph`, `record_external` becomes an
    external event-record node; after a replay the host's wait returns and the pinned buffer
    written by the non-blocking D2H copy before it holds the new values. Outside capture the
    external flag is illegal (an InternalError), the eager path records plainly."""
    from services.worker.program.events import ReadyEvent
    from shared.errors import InternalError

    event = ReadyEvent()
    src = torch.zeros(64, dtype=torch.int64, device="cuda")
    host = torch.zeros(64, dtype=torch.int64, pin_memory=True)
    work = torch.randn(2048, 2048, device="cuda")
    with pytest.raises(InternalError):
        event.record_external(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        src.add_(1)
        host.copy_(src, non_blocking=True)
        event.record_external(torch.cuda.current_stream())
        out = work
        for _ in range(20):
            out = out @ work  # the rest of the graph runs after the record
    for expected in (1, 2):
        graph.replay()
        event.wait()
        assert int(host[0]) == expected and int(host[-1]) == expected
    torch.cuda.synchronize()
    del out, graph
    event.close()


def test_dflash2_sampled_on_cuda_stays_in_the_language(dense, tmp_path):
    write_checkpoint(tmp_path, dense, dflash2=True)
    opts = RequestOptions(max_tokens=24, constraint=OutputConstraint.regex("(ab|abc|c)+d"),
                          sampling=SamplingParams(temperature=1.0, seed=3))
    fins, engine = asyncio.run(_run(dense, [(f"s{i}", "abc", opts) for i in range(3)],
                                    speculative="dflash2", draft_model=str(tmp_path),
                                    num_draft_tokens=4))
    assert engine.speculation.rounds > 0
    for fin in fins:
        assert fin.error is None
        if fin.finish_reason.value == "stop":
            assert re.fullmatch("(ab|abc|c)+d", fin.content)


def _qwen35(dtype: torch.dtype, mtp: bool = False) -> ModelRuntime:
    d = byte_domain()
    model = random_qwen35(dtype=dtype, device="cuda", vocab_size=d.size, mtp=mtp, seed=3,
                          **SHAPE)
    return ModelRuntime("q35-tiny", model, model.config, Frontend("q35-tiny", d, ByteTokenizer(d)))


@pytest.mark.parametrize("kind,graphs", [("dflash", True), ("dflash", False),
                                         ("dflash2", True)])
def test_draft_models_on_a_qwen35_target_on_cuda_equal_ordinary_greedy(kind, graphs, tmp_path):
    """The hybrid target in float32 (where the K+1-token verify forward and the plain decode
    step agree far below any greedy tie): the draft taps its GDN and attention layer, each
    round's commit keeps the recurrent state and conv windows at the accepted prefix, in the
    captured DFlash Forward graph or eagerly."""
    runtime = _qwen35(torch.float32)
    write_checkpoint(tmp_path, runtime, dflash2=kind == "dflash2", target_layer_ids=(0, 1))
    base, _ = asyncio.run(_run(runtime))
    fins, engine = asyncio.run(_run(runtime, speculative=kind, draft_model=str(tmp_path),
                                    num_draft_tokens=4, cuda_graphs=graphs))
    _same(fins, base)
    assert engine.speculation.rounds > 0 and engine.program.draft_wait_seconds > 0
    assert bool(engine.program.captured_sizes.get("dflash")) == (graphs and kind == "dflash")


@pytest.mark.parametrize("kind", ["dflash", "dflash2"])
def test_draft_models_on_a_bf16_qwen35_target_on_cuda_run_constrained(kind, tmp_path):
    """bf16 (the served dtype, Triton kernels and the captured Forward graph): every row ends
    without error and a finished constrained row is in its language. Token equality with plain
    greedy in bf16 needs the verify forward and the decode step on one width-invariant route,
    which this test does not claim."""
    runtime = _qwen35(torch.bfloat16)
    write_checkpoint(tmp_path, runtime, dflash2=kind == "dflash2", target_layer_ids=(0, 1))
    fins, engine = asyncio.run(_run(runtime, speculative=kind, draft_model=str(tmp_path),
                                    num_draft_tokens=4))
    assert engine.speculation.rounds > 0
    for fin in fins:
        assert fin.error is None, fin.error
    if fins[1].finish_reason.value == "stop":
        assert re.fullmatch("(ab|cd)+x", fins[1].content)


@pytest.mark.parametrize("graphs", [True, False])
def test_mtp_on_cuda_equals_ordinary_greedy(graphs):
    """MTP rounds with the decode and verify graphs keeping the final hidden states, or eager."""
    runtime = _qwen35(torch.float32, mtp=True)
    base, _ = asyncio.run(_run(runtime))
    fins, engine = asyncio.run(_run(runtime, speculative="mtp", num_draft_tokens=3,
                                    cuda_graphs=graphs, warmup=True))
    _same(fins, base)
    assert engine.speculation.rounds > 0
    assert bool(engine.program.captured_sizes.get("verify")) == graphs
    # With graphs the draft pass of decode and verify rows replays its own graph
    # (spec/mtp_graphs.py), every one captured by the warm-up (3 sizes x widths 1..K+1), none
    # on the request path; eager, the same function runs op by op.
    mtp = engine.proposer.inner
    assert (mtp.graph_replays > 0) == graphs
    assert engine.warmup.proposer_graphs == (3 * 4 if graphs else 0)
    if graphs:
        assert mtp._graphs.captures == engine.warmup.proposer_graphs
