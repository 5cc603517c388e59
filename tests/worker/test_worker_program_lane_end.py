"""A prefill forward near a lane's end runs only at widths the warm-up visited
(program/buckets.py `plan_widths`, prefill_graphs.py `lane_breaks`).

Rule (buckets.py): "A forward never runs at a width the warm-up has not visited, at a lane's end
included: where a row's padded width would leave its lane, `plan_widths` splits its tokens into
consecutive forwards of warmed widths that stay inside it"; the split is exact in the sense right
padding is ("padded KV lies past the committed frontier and is overwritten before it is read, and
padded tokens leave a hybrid model's state unchanged"). Before it, such a forward ran unpadded (a
497-token last chunk compiled the attention kernels on the request path on the H200), and a
prefix hit's question in a lane's last positions skipped its prefill graph.
"""

from __future__ import annotations

import asyncio

import pytest
import torch

from bench.random_weights import ByteTokenizer, random_qwen35, random_runtime
from services.worker.program.buckets import EXACT_WIDTHS, plan_widths, prefill_widths
from services.worker.program.prefill_graphs import GRAPH_WIDTHS, graph_width, lane_breaks, segments
from services.worker.runtime import ModelRuntime
from shared.frontends.frontend import Frontend
from tests.support.common import byte_domain
from tests.support.worker_support import (
    collect,
    greedy,
    hooked,
    open_client,
    text_request,
    until_warm,
)
from tests.worker.test_worker_program_prefill_graphs import QWEN35_SHAPE, _EagerGraphs

# ---------------------------------------------------------------- the plan


def _check(plan, start: int, length: int, max_len: int, widths) -> None:
    # every piece at one of `widths`, holding its tokens, inside the lane; the pieces cover
    # exactly `length` tokens
    at = start
    for tokens, width in plan:
        assert width in widths and 1 <= tokens <= width, plan
        assert at + width <= max_len, (plan, start, max_len)
        at += tokens
    assert at == start + length, plan


@pytest.mark.parametrize("max_len", [100, 136, 700, 2031])
def test_every_piece_is_warmed_inside_the_lane_and_the_pieces_are_as_few_as_can_be(max_len):
    """For every start and chunk length a step can feed: the plan's pieces are widths of the
    warm-up's set (`prefill_widths` of the chunk), stay inside the lane, cover the tokens; one
    piece wherever the padded width fits (the forward of before), else ceil(length / L) with L
    the widest warmed width that fits (no plan has fewer: no piece feeds more than L)."""
    chunk = 512
    every = prefill_widths(max_len, max_len)
    warmed = set(prefill_widths(chunk, max_len))
    for start in range(0, max_len):
        room = max_len - start
        for length in range(1, min(chunk, room) + 1):
            plan = plan_widths(start, length, max_len, every)
            _check(plan, start, length, max_len, warmed)
            whole = next(w for w in every if w >= length) if length <= every[-1] else None
            if whole is not None and whole <= room:
                assert plan == [(length, whole)]
            else:
                widest = max(w for w in every if w <= room)
                assert len(plan) == -(-length // widest)


def test_the_measured_last_chunk_splits_into_two_chunked_forwards():
    """The H200's 497-token last chunk with 500 positions left (512 would leave the lane): 49
    tokens at 64, then 448 at 448; both wider than EXACT_WIDTHS (the chunked recurrence)."""
    widths = prefill_widths(4096, 4096)
    assert plan_widths(3596, 497, 4096, widths) == [(49, 64), (448, 448)]
    assert plan_widths(0, 497, 4096, widths) == [(497, 512)]  # room: the padded forward
    assert all(w > EXACT_WIDTHS for _, w in plan_widths(3596, 497, 4096, widths))


def test_a_graph_plan_near_the_lane_end_and_where_none_fits():
    """A hit's 22-token question at position 2000 of a 2031-position lane: a 32-wide graph would
    leave it; 6 tokens at 8 then 16 at 16 stay inside. Fewer positions left than the narrowest
    graph: no graph plan (the step runs eagerly)."""
    assert plan_widths(2000, 22, 2031, GRAPH_WIDTHS) == [(6, 8), (16, 16)]
    assert plan_widths(2025, 3, 2031, GRAPH_WIDTHS) is None


def test_lane_breaks_make_every_segment_fit_every_rows_lane():
    """Rows of a graph step (start, tokens) with snapshot cuts: after `lane_breaks` every segment
    forward's graph width stays inside each of its rows' lanes; only rows whose lane it left
    are planned; no breaks where everything fits."""
    max_len = 136
    assert lane_breaks([(0, 20), (40, 30)], [16], max_len) == ([], set())
    gen = torch.Generator().manual_seed(0)
    for _ in range(400):
        n = int(torch.randint(1, 4, (1,), generator=gen))
        rows = []
        for _ in range(n):
            length = int(torch.randint(1, 65, (1,), generator=gen))
            start = int(torch.randint(0, max_len - length + 1, (1,), generator=gen))
            rows.append((start, length))
        cuts = sorted({int(torch.randint(1, length + 1, (1,), generator=gen))
                       for _, length in rows[:1]})
        fit = lane_breaks(rows, cuts, max_len)
        if fit is None:  # a row ends within the narrowest graph of the lane's end
            assert any(max_len - (s + k) < GRAPH_WIDTHS[0] for s, k in rows), rows
            continue
        breaks, split = fit
        for p, t, sub in segments([k for _, k in rows], cuts + breaks):
            width = graph_width(t - p)
            assert width is not None
            assert all(rows[i][0] + p + width <= max_len for i in sub), (rows, cuts, breaks)
        if not split:
            assert not breaks


# ---------------------------------------------------------------- served, on the CPU

MAX_LEN, CHUNK = 136, 80


def _dense(dtype=torch.float64, device="cpu") -> ModelRuntime:
    return random_runtime(byte_domain(), dtype=dtype, device=device, seed=4)


def _qwen35(dtype=torch.float64, device="cpu") -> ModelRuntime:
    d = byte_domain()
    model = random_qwen35(dtype=dtype, device=device, vocab_size=d.size, seed=5, **QWEN35_SHAPE)
    return ModelRuntime("q35-tiny", model, model.config, Frontend("q35-tiny", d, ByteTokenizer(d)))


def _prompts(runtime) -> list:
    # A: 115 tokens, its last chunk 35 tokens from position 80 (a padded 64 would leave the
    # 136-position lane); B: shares A's first 113 tokens (a hit at block 112: 7 blocks of 16, a
    # hybrid model's snapshot at A's last full block), then a 20-token question from 112 (a
    # 32-wide graph would leave the lane)
    a = "".join(chr(97 + (7 * i) % 26) for i in range(115))
    b = a[:113] + "QRSTUVWXYZ" * 2
    b = b[:132]
    requests = [text_request("a", a, greedy(3), runtime.name),
                text_request("b", b, greedy(3), runtime.name)]
    assert [len(runtime.prepare(r.prompt).token_ids) for r in requests] == [115, 132]
    return requests


async def _serve(runtime, *, fixed: bool, graphs: bool):
    # fixed: the CUDA Forward's widths (bucketed, lane-end plans) on the CPU; else every forward
    # at its own width (the reference). graphs: the prefill graph route, run eagerly.
    hooked_runtime, model = hooked(runtime)
    widths: list[int] = []
    model.before = lambda tokens, positions, lanes: widths.append(tokens.shape[1])
    client = open_client(hooked_runtime, max_batch=2, max_len=MAX_LEN, prefill_chunk=CHUNK)
    forward = client.engine.program.forward
    forward.bucketed = fixed
    if graphs:  # one request at a time: lane 1 is the padding rows' scratch lane
        forward.prefill_graphs = _EagerGraphs(2, scratch_lane=1)
    try:
        out = [await collect(client, r) for r in _prompts(runtime)]
    finally:
        await client.aclose()
    return [fin for _, fin in out], widths, forward


@pytest.mark.asyncio
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("kind", ["dense", "qwen35"])
async def test_lane_end_prefill_runs_warmed_widths_and_equals_the_plain_forwards(kind, graphs):
    """A cold prompt whose last chunk would pad past the lane, then a prefix hit whose question
    sits in the lane's last positions: every forward ran at a warmed width (the warm-up's
    prefill widths, decode's 1, the graph widths), the question through graphs, and the outputs
    and cached tokens equal those of plain forwards at their own widths (float64 models: the
    pieces' routes agree far below a greedy tie; a hybrid piece of <= EXACT_WIDTHS tokens takes
    the per-token recurrence where the one forward took the chunked one)."""
    runtime = _dense() if kind == "dense" else _qwen35()
    plain, _, _ = await _serve(runtime, fixed=False, graphs=False)
    got, widths, forward = await _serve(runtime, fixed=True, graphs=graphs)
    warmed = set(prefill_widths(CHUNK, MAX_LEN)) | {1} | (set(GRAPH_WIDTHS) if graphs else set())
    assert set(widths) <= warmed, sorted(set(widths) - warmed)
    if graphs:  # the hit's 20-token question ran as graphs of 16 and 8 inside the lane (dense:
        # 4 tokens at 8, then 16 at 16; hybrid: split at its snapshot cut, position 128)
        assert {(1, 16), (1, 8)} <= forward.prefill_graphs.seen
    if not (graphs and kind == "qwen35"):  # there every segment fits once split at its cuts
        assert forward.lane_end_rows > 0
    assert got[1].usage.cached_tokens == 112 == plain[1].usage.cached_tokens
    for a, b in zip(got, plain):
        assert a.error is None and b.error is None
        assert a.content == b.content and a.usage.completion_tokens == 3


@pytest.mark.asyncio
@pytest.mark.parametrize("graphs", [False, True])
@pytest.mark.parametrize("kind", ["dense", "qwen35"])
async def test_rows_of_one_step_near_their_lanes_end_equal_the_plain_forwards(kind, graphs):
    """Two prompts prefilled together (steps of several rows, one near its lane's end while the
    other is not; graph steps split where one row's pieces end): warmed widths only, and the
    outputs of plain forwards."""
    runtime = _dense() if kind == "dense" else _qwen35()
    texts = ["".join(chr(97 + (k * i) % 26) for i in range(n)) for k, n in ((7, 115), (5, 126))]

    async def serve(fixed: bool, graphs: bool):
        hooked_runtime, model = hooked(runtime)
        widths: list[int] = []
        model.before = lambda tokens, positions, lanes: widths.append(tokens.shape[1])
        client = open_client(hooked_runtime, max_batch=3, max_len=MAX_LEN, prefill_chunk=48)
        forward = client.engine.program.forward
        forward.bucketed = fixed
        if graphs:  # two lanes serve, the third is the padding rows' scratch lane
            forward.prefill_graphs = _EagerGraphs(3, scratch_lane=2)
        try:
            out = await asyncio.gather(*(collect(client, text_request(
                f"r{i}", t, greedy(MAX_LEN - len(t)), runtime.name)) for i, t in enumerate(texts)))
        finally:
            await client.aclose()
        return [fin for _, fin in out], widths, forward

    plain, _, _ = await serve(False, False)
    got, widths, forward = await serve(True, graphs)
    warmed = set(prefill_widths(48, MAX_LEN)) | {1} | (set(GRAPH_WIDTHS) if graphs else set())
    assert set(widths) <= warmed, sorted(set(widths) - warmed)
    assert forward.lane_end_rows > 0
    for a, b in zip(got, plain):
        assert a.error is None and b.error is None and a.content == b.content


@pytest.mark.asyncio
@pytest.mark.parametrize("aligned_bucketed", [False, True])
async def test_mtp_reads_a_split_rows_hidden_states_as_one_forwards(aligned_bucketed):
    """With MTP drafting (the proposer reads the target's final hidden states), the last chunk
    split at the lane's end hands the proposer the row's 35 hidden states as one forward's: the
    drafts after it equal the MTP drafts computed from scratch over the whole sequence, and the
    outputs equal plain greedy decoding (spec/mtp.py). With the MTP alignment bucketed as on
    CUDA, the first chunk's alignment runs padded (80 -> 128) and the last one, whose padding
    would leave the lane, as pieces of warmed widths (3 at 3, then 32 at 32): drafts unchanged."""
    from tests.worker.test_worker_spec_mtp import SHAPE, _mtp_from_scratch

    d = byte_domain()
    model = random_qwen35(dtype=torch.float64, device="cpu", vocab_size=d.size, mtp=True, seed=3,
                          **SHAPE)
    runtime = ModelRuntime("q35-mtp", model, model.config, Frontend("q35-mtp", d, ByteTokenizer(d)))
    prompt = _prompts(runtime)[0].prompt.text

    async def run(speculative):
        client = open_client(runtime, max_batch=1, max_len=MAX_LEN, prefill_chunk=CHUNK,
                             speculative=speculative, num_draft_tokens=3)
        engine = client.engine
        engine.program.forward.bucketed = True
        seen = []
        if speculative:
            engine.proposer.inner.bucketed = aligned_bucketed
            inner = engine.proposer.propose

            def propose(job, n):
                drafts = inner(job, n)
                if drafts:
                    seen.append((job.prompt_ids + tuple(job.output_ids), drafts))
                return drafts

            engine.proposer.propose = propose
        try:
            _, fin = await collect(client, text_request("m", prompt, greedy(12), runtime.name))
        finally:
            await client.aclose()
        if speculative:
            assert (engine.proposer.inner.lane_end_rows > 0) == aligned_bucketed
        return fin, seen, engine.program.forward.lane_end_rows

    plain, _, _ = await run(None)
    fin, seen, split = await run("mtp")
    assert split > 0 and fin.error is None and fin.content == plain.content
    context, drafts = seen[0]
    assert len(context) == 116  # the first drafts: the prompt and the token its last chunk sampled
    assert drafts == _mtp_from_scratch(model, context, 3, d.size)[:len(drafts)]


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.asyncio
@pytest.mark.parametrize("kind", ["dense", "qwen35"])
async def test_no_kernel_compiles_at_the_lane_end(kind):
    """On CUDA after the start-up warm-up, the lane-end prompts of the CPU test (a last chunk
    that would pad past the lane, a hit's question in its last positions), with prefill graphs
    as served, compile no Triton kernel and run no autotuner (bench/compiles.py `compile_log`)."""
    from bench.compiles import compile_log

    runtime = (_dense if kind == "dense" else _qwen35)(dtype=torch.bfloat16, device="cuda")
    client = open_client(runtime, max_batch=1, max_len=MAX_LEN, prefill_chunk=CHUNK,
                         warmup=True)
    try:
        assert await until_warm(client) is not None
        with compile_log(True) as (seen, tag):
            for r in _prompts(runtime):
                tag(r.request_id)
                _, fin = await collect(client, r)
                assert fin.error is None
        assert seen == []
        # The lane end was met: split into warmed widths, or (Qwen3.5 with graphs) a hit's
        # question already split at its snapshot cuts into segments that fit the lane.
        forward = client.engine.program.forward
        assert forward.lane_end_rows > 0 or (
            kind == "qwen35" and forward.prefill_graphs.split_steps > 0)
    finally:
        await client.aclose()


async def _verify_to_the_lane_end(runtime, *, warmup: bool, bucketed: bool = False):
    # A 117-token prompt decoded to the lane's last position: first plainly (its sequence
    # recorded), then with the recorded continuation as drafts (K = 4: a round verifies 5
    # positions; the one at 132 would leave the lane). Returns (Finished, speculation, compiles).
    from bench.compiles import compile_log
    from bench.oracle import OracleProposer
    from tests.worker.test_worker_spec import with_proposer

    text = "".join(chr(97 + (7 * i) % 26) for i in range(117))  # rounds at 117, 122, ... 132
    n = MAX_LEN - 117
    oracle = OracleProposer()
    plain = open_client(runtime, max_batch=1, max_len=MAX_LEN, prefill_chunk=CHUNK)
    plain.engine.finish_listeners.append(
        lambda job: oracle.record(job.prompt_ids + tuple(job.output_ids)))
    try:
        _, want = await collect(plain, text_request("plain", text, greedy(n), runtime.name))
    finally:
        await plain.aclose()
    client = open_client(runtime, max_batch=1, max_len=MAX_LEN, prefill_chunk=CHUNK,
                         warmup=warmup, speculative="ngram", num_draft_tokens=4)
    client.engine.program.forward.bucketed |= bucketed
    with_proposer(client, oracle, 4)
    try:
        await until_warm(client)
        with compile_log(client.engine.program.cuda) as (seen, tag):
            tag("spec")
            _, fin = await collect(client, text_request("spec", text, greedy(n), runtime.name))
        assert fin.error is None and fin.content == want.content
        return fin, client.engine.speculation, seen
    finally:
        await client.aclose()


@pytest.mark.asyncio
async def test_verifying_up_to_the_lane_end_equals_plain_decoding():
    """The CPU run of the gpu test below: drafts accepted up to the lane's last position, the
    output equal to plain greedy decoding."""
    fin, spec, _ = await _verify_to_the_lane_end(_dense(), warmup=False, bucketed=True)
    assert spec.rounds > 0 and spec.accepted > 0 and fin.usage.completion_tokens == MAX_LEN - 117


@pytest.mark.gpu
@pytest.mark.asyncio
async def test_no_kernel_compiles_when_verifying_at_the_lane_end():
    """Speculative decoding (verify graphs of K+1 tokens) up to the lane's last position: a
    round whose K+1 positions would leave the lane verifies eagerly, one row at a time, at its
    own width (forward.py `verify`); after the warm-up that compiles nothing either (the
    warm-up runs no eager every-position verify forward: this checks that none is needed)."""
    runtime = _dense(dtype=torch.bfloat16, device="cuda")
    _, spec, seen = await _verify_to_the_lane_end(runtime, warmup=True)
    assert spec.rounds > 0 and seen == []
