"""Short prefill forwards through CUDA graphs (program/prefill_graphs.py): the shapes, and the
exactness of the padding a graph needs (rows padded on the right to the width bucket, the step
padded to the batch-size class with scratch-lane rows, attention bounded by the whole lane).

Design: "one CUDA graph per batch size for decode ... On CPU the same Program runs eagerly";
module docstring of buckets.py: "Right padding is exact: padded tokens sit after every real one
..., write KV only past the lane's committed frontier or into the trash block, and carry g = beta
= 0 through a hybrid model's recurrence, which leaves the state unchanged". The CPU cannot
capture graphs: the CPU tests prove that the padded eager forward a graph captures
(`static_prefill` on `padded_inputs`) gives the unpadded forward's logits and leaves the same
state; the gpu tests prove a replay equals that eager forward bit for bit.
"""

from __future__ import annotations

import pytest
import torch

from bench.random_weights import random_qwen35, random_runtime
from services.worker.program.graphs import graph_sizes
from services.worker.program.prefill_graphs import (
    GRAPH_WIDTHS,
    PrefillGraph,
    PrefillGraphs,
    graph_shapes,
    graph_width,
    padded_inputs,
    run_segments,
    segments,
    static_prefill,
)
from tests.support.common import byte_domain
from tests.support.worker_support import collect, open_client

QWEN35_SHAPE = dict(hidden_size=32, intermediate_size=48, num_heads=2, num_kv_heads=1,
                    head_dim=16, rotary_dim=4, linear_num_key_heads=1, linear_num_value_heads=2,
                    linear_key_head_dim=8, linear_value_head_dim=8, max_position_embeddings=512,
                    layer_types=("linear_attention", "full_attention", "linear_attention"))
LANES, MAX_LEN = 3, 160  # lane 2 is the scratch lane of padding rows
SCRATCH = LANES - 1


def test_every_width_up_to_the_widest_bucket_has_a_graph_width():
    """A forward of w tokens runs at the smallest graph width >= w; wider ones have none."""
    for w in range(1, GRAPH_WIDTHS[-1] + 1):
        g = graph_width(w)
        assert g in GRAPH_WIDTHS and g >= w
        assert all(x < w for x in GRAPH_WIDTHS if x < g)
    assert graph_width(GRAPH_WIDTHS[-1] + 1) is None


def test_graph_shapes_cover_each_step_a_prefill_chunk_holds():
    """Every (rows, widest row) a step of at most `prefill_chunk` tokens can hold finds its
    captured shape; no shape is captured that no step holds."""
    max_batch, chunk, max_len = 6, 40, 1000
    shapes = set(graph_shapes(max_batch, chunk, max_len))
    for rows in range(1, max_batch + 1):
        for widest in range(1, GRAPH_WIDTHS[-1] + 1):
            if widest + rows - 1 > chunk and widest > 1:
                continue  # no step of `chunk` tokens holds it
            size = next(s for s in graph_sizes(max_batch) if s >= rows)
            assert (size, graph_width(widest)) in shapes, (rows, widest)
    assert (8, 64) not in shapes and all(r in graph_sizes(max_batch) for r, _ in shapes)
    assert max(w for _, w in graph_shapes(1, 512, 20)) == 16  # no width past the lane
    assert max(w for _, w in graph_shapes(4, 8, 512)) == 8  # nor past the prefill chunk


def test_padded_inputs_pad_rows_right_and_the_step_with_scratch_rows():
    tokens, positions, lanes, fed = padded_inputs([[5, 6, 7], [9]], [10, 0], [4, 1], 4, 8, 7)
    assert tokens.tolist()[:2] == [[5, 6, 7, 0, 0, 0, 0, 0], [9, 0, 0, 0, 0, 0, 0, 0]]
    assert positions[0].tolist() == list(range(10, 18)) and positions[1].tolist() == list(range(8))
    assert positions[3].tolist() == list(range(8)) and not tokens[2:].any()
    assert lanes.tolist() == [4, 1, 7, 7] and fed.tolist() == [3, 1, 1, 1]


@pytest.fixture(scope="module")
def qwen35_runtime(tmp_path_factory):
    from services.worker.runtime import load_runtime
    from tests.support.qwen35_support import hf_causal_lm

    path = tmp_path_factory.mktemp("qwen35-graphs")
    hf_causal_lm(seed=5, max_position_embeddings=1024).save_pretrained(str(path))
    return load_runtime(str(path), dtype=torch.float64)


def _dense():
    return random_runtime(byte_domain(), dtype=torch.float64, seed=4).model


def _qwen35():
    return random_qwen35(dtype=torch.float64, device="cpu", vocab_size=byte_domain().size,
                         seed=5, **QWEN35_SHAPE)


def _close(got: torch.Tensor, want: torch.Tensor, kind: str) -> None:
    # float64 models: the dense one agrees to float64 rounding; the hybrid one's recurrent state
    # is float32 (models/qwen35_state.py), so a last-bit difference of a float64 GEMM of another
    # row count can round a state element the other way: agreement to float32 precision.
    tol = 1e-10 if kind == "dense" else 1e-5 * float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=0, atol=tol)
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def _prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _forward(model, state, lane: int, tokens: list[int], start: int) -> torch.Tensor:
    # The unpadded eager prefill of one row (forward.py `prefill` at its own width), committed.
    dev = state.device
    t = torch.tensor([tokens], device=dev)
    pos = torch.arange(start, start + len(tokens), device=dev)[None]
    lanes = torch.tensor([lane], device=dev)
    fed = torch.tensor([len(tokens)], device=dev)
    logits = model(t, pos, state, lanes, kv_len=start + len(tokens), logit_index=fed[:, None] - 1,
                   num_tokens=fed)[:, 0]
    _commit(state, lanes, fed)
    return logits


def _commit(state, lanes, fed) -> None:
    if hasattr(state, "commit"):
        state.commit(lanes, fed)


@pytest.mark.parametrize("kind", ["dense", "qwen35"])
@pytest.mark.parametrize("width", [3, 20, 40])
def test_the_padded_forward_a_graph_captures_equals_the_unpadded_one(kind, width):
    """A second chunk of `width` tokens after a 37-token first chunk, run (a) alone at its own
    width and kv bound, (b) as one row of a 2-row step padded to the graph width with a scratch
    row and attention bounded by max_len: the same logits, then the same logits of a next token
    fed to both (the lane's KV, recurrent state and conv window were left alike)."""
    model = _dense() if kind == "dense" else _qwen35()
    states = [model.new_state(LANES, MAX_LEN, dtype=torch.float64, device="cpu")
              for _ in range(2)]
    first, second = _prompt(37, 1), _prompt(width, 2)
    for state in states:
        _forward(model, state, 0, first, 0)
    with torch.no_grad():
        alone = _forward(model, states[0], 0, second, len(first))
        size, w = 2, graph_width(width)
        inputs = padded_inputs([second], [len(first)], [0], size, w, SCRATCH)
        padded = static_prefill(model, states[1], *inputs)
        assert padded.shape == (size, alone.shape[-1])
        _commit(states[1], torch.tensor([0]), torch.tensor([width]))
        _close(padded[:1], alone, kind)
        after = [_forward(model, s, 0, [42], len(first) + width) for s in states]
    _close(after[1], after[0], kind)


def test_a_lane_starting_at_position_zero_in_a_padded_step_starts_afresh():
    """A padded graph step whose row starts a lane (position 0) over a lane that held another
    request: the logits of a fresh state (a reused lane keeps nothing, models/qwen35.py)."""
    model = _qwen35()
    fresh, reused = (model.new_state(LANES, MAX_LEN, dtype=torch.float64, device="cpu")
                     for _ in range(2))
    _forward(model, reused, 1, _prompt(50, 7), 0)
    prompt = _prompt(11, 8)
    with torch.no_grad():
        want = _forward(model, fresh, 1, prompt, 0)
        got = static_prefill(model, reused, *padded_inputs([prompt], [0], [1], 1, 16, SCRATCH))
    _close(got, want, "qwen35")


def test_segments_end_at_every_cut_and_drop_rows_that_ended():
    """A row ends inside a segment (it feeds fewer tokens there), so segments end only at cuts
    and at the longest row's end."""
    assert segments([26, 9], [11, 26, 5]) == [(0, 5, [0, 1]), (5, 11, [0, 1]), (11, 26, [0])]
    assert segments([4], []) == [(0, 4, [0])]


@pytest.mark.parametrize("verify_width", [0, 4])
def test_a_step_split_at_its_snapshot_cuts_equals_the_eager_cut_forward(verify_width):
    """Design: "for hybrid models also the GDN recurrent and convolution state at prefill chunk
    boundaries ... a hit is exact". A 2-row step with snapshot cuts (a row continuing after 37
    tokens, cut at 11 and at its end 26; a fresh row of 9 cut at 5), run (a) as the eager forward
    with the cuts inside it (models/gdn.py), (b) as `run_segments`' padded segment forwards: the
    same logits, the same snapshots, and after committing each row whole the same next logits
    (with verify_width > 0 commit would replay a partial forward: the split one counts whole)."""
    model = _qwen35()
    states = [model.new_state(LANES + 1, MAX_LEN, dtype=torch.float64, device="cpu",
                              verify_width=verify_width) for _ in range(2)]
    scratch = LANES
    first, second, fresh = _prompt(37, 1), _prompt(26, 2), _prompt(9, 3)
    cuts = [(0, 11, 0), (0, 26, 1), (1, 5, 2)]
    lanes, fed = torch.tensor([0, 1]), torch.tensor([26, 9])
    for state in states:
        state.allocate_snapshots(4)
        _forward(model, state, 0, first, 0)
    with torch.no_grad():
        tokens = torch.zeros(2, 26, dtype=torch.int64)
        tokens[0], tokens[1, :9] = torch.tensor(second), torch.tensor(fresh)
        positions = torch.stack([torch.arange(37, 63), torch.arange(26)])
        states[0].cut_next(cuts)
        eager = model(tokens, positions, states[0], lanes, kv_len=63,
                      logit_index=(fed - 1)[:, None], num_tokens=fed)[:, 0]

        def forward(rows_tokens, starts, row_lanes):
            size = next(s for s in graph_sizes(LANES) if s >= len(rows_tokens))
            width = graph_width(max(len(t) for t in rows_tokens))
            inputs = padded_inputs(rows_tokens, starts, row_lanes, size, width, scratch)
            return static_prefill(model, states[1], *inputs)[:len(rows_tokens)]

        split = run_segments(states[1], [(second, 37, 0), (fresh, 0, 1)], cuts, forward)
        _close(split, eager, "qwen35")
        for slot in range(3):
            for snap in ("snap_ssm", "snap_conv"):
                _close(getattr(states[1], snap)[:, slot], getattr(states[0], snap)[:, slot],
                       "qwen35")
        after = []
        for state in states:
            state.commit(lanes, fed)
            nxt = model(torch.tensor([[42], [43]]), torch.tensor([[63], [9]]), state, lanes,
                        kv_len=64)
            after.append(nxt[:, 0])
    _close(after[1], after[0], "qwen35")


class _EagerGraphs(PrefillGraphs):
    """PrefillGraphs on the CPU, where nothing is captured: every shape reads as a failed
    capture, so the Forward takes the graph route (padding, bucketing, the split at snapshot
    cuts) with each padded forward run eagerly through `static_prefill`."""

    def __init__(self, max_batch: int, scratch_lane: int) -> None:
        self._scratch, self._sizes, self._graphs = scratch_lane, graph_sizes(max_batch), {}
        self.replays = self.split_steps = 0
        self.seen: set[tuple[int, int]] = set()

    def get(self, size: int, width: int):
        self.seen.add((size, width))
        return None, False


@pytest.mark.asyncio
@pytest.mark.parametrize("chunk", [24, 40])
async def test_served_outputs_through_the_graph_route_equal_the_eager_ones(qwen35_runtime, chunk):
    """Issue: "outputs identical to the eager prefill". The prefix-cache requests of a ~300-token
    system prompt with new questions (greedy, seeded, JSON Schema) served with the prefill graph
    route (one request at a time: the second lane is the padding rows' scratch lane) give the
    outputs and cached-token counts of the plain eager route; the route ran whole graph shapes
    and split steps at snapshot cuts (chunks of 24 and 40 tokens: cuts at block boundaries fall
    inside forwards, so split steps have several segments)."""
    from tests.worker.test_worker_engine_qwen35_prefix import _requests

    async def serve(graphs: bool):
        client = open_client(qwen35_runtime, max_batch=2, max_len=512, prefill_chunk=chunk)
        route = _EagerGraphs(2, scratch_lane=1) if graphs else None
        client.engine.program.forward.prefill_graphs = route
        try:
            return [await collect(client, r) for r in _requests(qwen35_runtime.name)], route
        finally:
            await client.aclose()

    plain, _ = await serve(False)
    routed, route = await serve(True)
    for (_, a), (_, b) in zip(routed, plain):
        assert a.content == b.content and a.usage.cached_tokens == b.usage.cached_tokens
    assert route.split_steps > 0 and route.seen


# ---------------------------------------------------------------- CUDA


def _cuda_models():
    dense = random_runtime(byte_domain(), dtype=torch.bfloat16, device="cuda", seed=4).model
    hybrid = random_qwen35(dtype=torch.bfloat16, device="cuda", vocab_size=byte_domain().size,
                           seed=5, **QWEN35_SHAPE)
    return {"dense": dense, "qwen35": hybrid}


@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["dense", "qwen35"])
@pytest.mark.parametrize("width", [8, 32, 64])
def test_a_replayed_prefill_graph_equals_its_eager_forward_bit_for_bit(kind, width):
    """The graph (2 rows of `width`, one real row after a 37-token chunk, one scratch row) and
    the eager `static_prefill` of the same inputs on a twin state: equal logits, then equal
    logits of one more token on both (the state the replay left is the eager one's)."""
    model = _cuda_models()[kind]
    states = [model.new_state(LANES, MAX_LEN, dtype=torch.bfloat16, device="cuda")
              for _ in range(2)]
    first, second = _prompt(37, 1), _prompt(width - 3, 2)
    with torch.no_grad():
        for state in states:
            _forward(model, state, 0, first, 0)
        inputs = padded_inputs([second], [len(first)], [0], 2, width, SCRATCH)
        graph = PrefillGraph(model, states[1], 2, width, SCRATCH, torch.cuda.graph_pool_handle())
        # capture ran the forward on scratch rows only; lane 0 of both states is still alike
        eager = static_prefill(model, states[0], *(t.cuda() for t in inputs))
        replay = graph.run(*inputs).clone()
        torch.cuda.synchronize()
        assert torch.equal(replay[:1], eager[:1])
        fed = torch.tensor([len(second)], device="cuda")
        after = []
        for state in states:
            _commit(state, torch.tensor([0], device="cuda"), fed)
            after.append(_forward(model, state, 0, [42], len(first) + len(second)))
    assert torch.equal(after[0], after[1])


@pytest.mark.gpu
def test_a_step_split_at_its_cuts_through_graphs_equals_the_eager_segments_bit_for_bit():
    """The split step of the CPU test on CUDA: its segment forwards replayed from PrefillGraphs
    against the same segments run eagerly (`static_prefill`) on a twin state: equal logits,
    snapshots and next logits."""
    from services.worker.program.prefill_graphs import PrefillGraphs

    model = _cuda_models()["qwen35"]
    states = [model.new_state(LANES, MAX_LEN, dtype=torch.bfloat16, device="cuda")
              for _ in range(2)]
    first, second, fresh = _prompt(37, 1), _prompt(26, 2), _prompt(9, 3)
    cuts = [(0, 11, 0), (0, 26, 1), (1, 5, 2)]
    lanes = torch.tensor([0, 1], device="cuda")
    fed = torch.tensor([26, 9], device="cuda")
    with torch.no_grad():
        for state in states:
            state.allocate_snapshots(4)
            _forward(model, state, 0, first, 0)
        graphs = PrefillGraphs(model, states[1], 2, scratch_lane=SCRATCH)

        def eager(rows_tokens, starts, row_lanes):
            shape = graphs.shape(len(rows_tokens), max(len(t) for t in rows_tokens))
            inputs = padded_inputs(rows_tokens, starts, row_lanes, *shape, SCRATCH)
            return static_prefill(model, states[0], *(t.cuda() for t in inputs))

        def replay(rows_tokens, starts, row_lanes):
            shape = graphs.shape(len(rows_tokens), max(len(t) for t in rows_tokens))
            graph, _ = graphs.get(*shape)
            assert graph is not None, shape
            inputs = padded_inputs(rows_tokens, starts, row_lanes, *shape, SCRATCH)
            return graph.run(*inputs)

        for shape in ((2, 8), (1, 16)):  # the segments: 5 and 6 tokens of 2 rows, 15 of 1
            graphs.get(*shape)
        rows = [(second, 37, 0), (fresh, 0, 1)]
        want = run_segments(states[0], rows, cuts, eager)
        got = run_segments(states[1], rows, cuts, replay)
        torch.cuda.synchronize()
        assert torch.equal(got, want)
        for snap in ("snap_ssm", "snap_conv"):
            assert torch.equal(getattr(states[1], snap), getattr(states[0], snap))
        after = []
        for state in states:
            state.commit(lanes, fed)
            after.append(model(torch.tensor([[42], [43]], device="cuda"),
                               torch.tensor([[63], [9]], device="cuda"), state, lanes,
                               kv_len=64)[:, 0])
    assert torch.equal(after[0], after[1])
