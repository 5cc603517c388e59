"""The Triton GEMV (kernels/gemv.py) against its torch reference `gemv_ref`.

Backends: `interpreter` (small shapes under TRITON_INTERPRET=1, every mode, split-K, bias, bf16 /
fp16 / fp32) in a child pytest, because TRITON_INTERPRET must be set before triton is first
imported (see tests/kernels/test_kernels_gdn.py); `cuda` marked gpu at the real decode shapes
(Qwen3-8B and Qwen3.5-9B linear layers) against F.linear within bf16 tolerance, plus run-to-run bit
equality.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kernels import gemv as G
from kernels import gemv_configs as C
from tests.support.kernel_backends import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()

# tolerance relative to the output's magnitude: the kernel and the reference round a float32 sum
# once, differing only in float32 summation order, so bf16/fp16 results differ by at most a rounding
# flip (one unit in the last place) and float32 results by a few float32 ulps times sqrt(K)
ULP = {torch.float32: 2.0 ** -18, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


def _case(M, N, K, dtype, *, bias, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(device=device, dtype=dtype)
    w = (torch.randn(N, K, generator=g) * K ** -0.5).to(device=device, dtype=dtype)
    b = torch.randn(N, generator=g).to(device=device, dtype=dtype) if bias else None
    return x, w, b


def _assert_close(y, ref, dtype, ulps=2.0):
    assert y.dtype == ref.dtype == dtype and y.shape == ref.shape
    scale = max(1.0, ref.float().abs().max().item())
    err = (y.float() - ref.float()).abs().max().item()
    assert err <= ulps * ULP[dtype] * scale, (err, scale)


INTERP_CONFIGS = [
    C.GemvConfig(16, 32, 1, 4, 2, "acc"),
    C.GemvConfig(16, 32, 3, 4, 2, "acc"),
    C.GemvConfig(32, 64, 2, 4, 2, "sum"),
    C.GemvConfig(16, 32, 4, 4, 2, "dot"),
    C.GemvConfig(32, 16, 1, 4, 2, "dot"),
]


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter child process")
def test_gemv_interpreter():
    """Every mode, with and without split-K, at M in 1, 3, 8, 16 with N and K not multiples of the
    blocks, with and without bias, in float16, bfloat16 and float32; plus the heuristic config, a
    3-D x and N, K that are multiples of the blocks (the unmasked EVEN paths)."""
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for M in (1, 3, 8, 16):
            for i, config in enumerate(INTERP_CONFIGS):
                x, w, b = _case(
                    M, 37 + 8 * i, 75 + 16 * M, dtype, bias=(M + i) % 2 == 0, seed=M * 10 + i
                )
                _assert_close(G.gemv(x, w, b, config), G.gemv_ref(x, w, b), dtype)
        x, w, b = _case(6, 64, 256, dtype, bias=True, seed=99)
        x = x.reshape(2, 3, 256)
        for config in (
            None,
            C.GemvConfig(32, 64, 2, 4, 2, "acc"),
            C.GemvConfig(16, 64, 1, 4, 2, "dot"),
        ):
            y = G.gemv(x, w, b, config)
            assert y.shape == (2, 3, 64)
            _assert_close(y, G.gemv_ref(x, w, b), dtype)
    # a split that leaves fewer tiles than splits, and x with a row stride (a column slice)
    x, w, b = _case(2, 40, 48, torch.bfloat16, bias=True, seed=5)
    _assert_close(
        G.gemv(x, w, b, C.GemvConfig(16, 32, 8, 4, 2, "acc")), G.gemv_ref(x, w, b), torch.bfloat16
    )
    wide = torch.randn(3, 100).to(torch.bfloat16)
    xs, ws = wide[:, 10:58], _case(3, 24, 48, torch.bfloat16, bias=False, seed=6)[1]
    _assert_close(
        G.gemv(xs, ws, None, C.GemvConfig(16, 16, 2, 4, 2, "sum")),
        G.gemv_ref(xs, ws),
        torch.bfloat16,
    )


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter child process")
def test_invariant_route_tiles_rows_interpreter():
    """The width-invariant route's "dot" tiles of 16 rows beyond 16 rows (a verify forward's
    B x (K+1)): 40 rows in three tiles with split-K and bias against gemv_ref, and each row the same
    bits as that row alone."""
    x, w, b = _case(40, 40, 96, torch.bfloat16, bias=True, seed=7)
    config = C.GemvConfig(16, 32, 2, 4, 2, "dot")
    y = G.gemv(x, w, b, config)
    _assert_close(y, G.gemv_ref(x, w, b), torch.bfloat16)
    for m in (0, 15, 16, 39):
        assert torch.equal(G.gemv(x[m:m + 1], w, b, config)[0], y[m]), m


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_gemv_under_interpreter():
    """Triton's interpreter runs the GEMV on small shapes against gemv_ref (a child pytest with
    TRITON_INTERPRET=1)."""
    run_interpreted(__file__, timeout=600)


@pytest.mark.skipif(INTERPRETED, reason="checks run in the parent process")
def test_heuristic_configs():
    """pick_config: elementwise modes at M <= 2, dot above; split-K only when the slabs are too few
    for ~4 waves of 132 SMs, never cutting K below 4 tiles a split; TUNED overrides it."""
    measured = dict(C.TUNED)
    C.TUNED.clear()  # the heuristic alone
    try:
        for M in (1, 2, 4, 8, 16):
            for N, K in (
                (6144, 4096),
                (4096, 4096),
                (24576, 4096),
                (4096, 12288),
                (248320, 4096),
                (12352, 4096),
            ):
                c = C.pick_config(M, N, K)
                assert c.mode in ("acc", "sum", "dot") and (c.mode != "dot") == (M <= 2)
                slabs = -(-N // c.block_n)
                assert c.split == 1 or slabs * c.split // 2 < 4 * 132
                assert K // (c.split * c.block_k) >= 4 or c.split == 1
        assert C.pick_config(1, 248320, 4096).split == 1 and C.pick_config(1, 4096, 4096).split > 1
        tuned = C.GemvConfig(128, 256, 3, 8, 3, "sum")
        C.TUNED[(4096, 4096)] = {4: tuned}
        assert C.pick_config(3, 4096, 4096) == tuned and C.pick_config(5, 4096, 4096) != tuned
    finally:
        C.TUNED.clear()
        C.TUNED.update(measured)
    for (N, K), buckets in C.TUNED.items():  # measured entries are what pick_config returns
        for bucket, config in buckets.items():
            assert C.pick_config(bucket, N, K) == config


@pytest.mark.skipif(INTERPRETED, reason="checks run in the parent process")
def test_invariant_configs():
    """One config per weight shape for every row count: INVARIANT's entry, else TUNED's dot config
    of the smallest bucket, else a dot tile with one row's split; elementwise modes ("acc", whose
    reduction layout follows BLOCK_M = the rows) never. Only "dot" takes more than 16 rows."""
    for N, K in ((6144, 4096), (4096, 4096), (24576, 4096), (4096, 12288), (248320, 4096)):
        c = C.invariant_config(N, K)
        assert c.mode == "dot" and c.block_m(1) == c.block_m(64) == 16
        if (N, K) not in C.INVARIANT and not any(
                t.mode == "dot" for t in C.TUNED.get((N, K), {}).values()):
            assert c.split == C.choose_split(1, N, K, c.block_n, c.block_k)
    assert C.invariant_config(4096, 4096) in C.TUNED[(4096, 4096)].values() or \
        (4096, 4096) in C.INVARIANT
    with pytest.raises(ValueError):
        G.gemv(torch.empty(17, 16, dtype=torch.bfloat16), torch.empty(20, 16, dtype=torch.bfloat16),
               config=C.GemvConfig(16, 16, 1, 4, 2, "acc"))
    with pytest.raises(ValueError):
        G.gemv(torch.empty(G.INVARIANT_MAX_ROWS + 1, 16, dtype=torch.bfloat16),
               torch.empty(20, 16, dtype=torch.bfloat16),
               config=C.GemvConfig(16, 16, 1, 4, 2, "dot"))
    meta = dict(device="meta", dtype=torch.bfloat16)
    assert not G.use_gemv(torch.empty(64, 16, **meta), torch.empty(20, 16, **meta),
                          invariant=True)  # not CUDA


@pytest.mark.skipif(INTERPRETED, reason="checks run in the parent process")
def test_linear_dispatch_off_cuda():
    """Off CUDA (and for float32, many rows or a non-contiguous weight) linear is F.linear."""
    x, w, b = _case(3, 20, 16, torch.bfloat16, bias=True)
    assert not G.use_gemv(x, w, b)
    assert torch.equal(G.linear(x, w, b), F.linear(x, w, b))
    meta = dict(device="meta")
    xm, wm = (
        torch.empty(4, 16, dtype=torch.bfloat16, **meta),
        torch.empty(20, 16, dtype=torch.bfloat16, **meta),
    )
    assert not G.use_gemv(xm, wm)  # not CUDA
    with pytest.raises(ValueError):
        G.gemv(torch.empty(17, 16, dtype=torch.bfloat16), torch.empty(20, 16, dtype=torch.bfloat16))
    with pytest.raises(ValueError):
        G.gemv(torch.empty(2, 16, dtype=torch.bfloat16), torch.empty(20, 16, dtype=torch.float16))


# (name, N, K): the Qwen3-8B linear layers after fusion, and the Qwen3.5-9B ones that differ
REAL_SHAPES = [
    ("qkv", 6144, 4096),
    ("o", 4096, 4096),
    ("gate_up", 24576, 4096),
    ("down", 4096, 12288),
    ("lm_head", 248320, 4096),
    ("gdn_in_proj", 12352, 4096),
    ("qwen35_attn_qkv", 10240, 4096),
]


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name,N,K", REAL_SHAPES, ids=[s[0] for s in REAL_SHAPES])
def test_gemv_cuda_real_shapes(name, N, K):
    """The heuristic config at M = 1..16 against F.linear (bf16 tolerance) and gemv_ref (float32
    summation-order tolerance), bit-equal run to run; linear() takes the kernel where TUNED holds
    a measured config for the shape and row bucket, F.linear elsewhere."""
    torch.manual_seed(0)
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).to(torch.bfloat16)
    for M in (1, 2, 3, 4, 8, 16):
        x = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        y = G.gemv(x, w)
        ref = F.linear(x, w)
        scale = ref.float().abs().max().item()
        assert (y.float() - ref.float()).abs().max().item() <= 2 * ULP[torch.bfloat16] * scale
        _assert_close(y, G.gemv_ref(x, w), torch.bfloat16)
        assert torch.equal(y, G.gemv(x, w))
        bucket = 1 << (M - 1).bit_length()  # linear() takes the kernel where a config was measured
        assert G.use_gemv(x, w) == (bucket in C.TUNED.get((N, K), {}))
        assert torch.equal(G.linear(x, w), y if G.use_gemv(x, w) else F.linear(x, w))
    del w
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("name,N,K", REAL_SHAPES, ids=[s[0] for s in REAL_SHAPES])
def test_invariant_route_rows_do_not_depend_on_the_row_count_cuda(name, N, K):
    """linear(..., invariant=True) at the real shapes: each row of an M-row product (the decode
    batches 1..16 and verify forwards up to 4 x 16 rows) is bit for bit that row's product alone,
    within bf16 of F.linear, inside a CUDA graph too."""
    torch.manual_seed(1)
    w = (torch.randn(N, K, device="cuda") * K ** -0.5).to(torch.bfloat16)
    x = torch.randn(64, K, device="cuda").to(torch.bfloat16)
    alone = torch.cat([G.linear(x[m:m + 1], w, invariant=True) for m in range(64)])
    ref = F.linear(x, w)
    assert (alone.float() - ref.float()).abs().max().item() <= \
        2 * ULP[torch.bfloat16] * ref.float().abs().max().item()
    for M in (2, 3, 8, 16, 20, 32, 64):
        assert torch.equal(G.linear(x[:M], w, invariant=True), alone[:M]), M
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = G.linear(x[:12], w, invariant=True)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, alone[:12])
    del w
    torch.cuda.empty_cache()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("mode", ["acc", "sum", "dot"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gemv_cuda_modes_bias(mode, dtype):
    """Every mode with split-K and bias on CUDA, and inside a CUDA graph."""
    x, w, b = _case(5, 3000, 4096 + 64, dtype, bias=True, device="cuda")
    for split in (1, 4):
        c = C.GemvConfig(32, 128, split, 4, 3, mode)
        _assert_close(G.gemv(x, w, b, c), G.gemv_ref(x, w, b), dtype)
    c = C.GemvConfig(32, 128, 4, 4, 3, mode)
    eager = G.gemv(x, w, b, c)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = G.gemv(x, w, b, c)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
