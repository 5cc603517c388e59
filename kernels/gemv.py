"""Triton GEMV for decode: y = x @ W^T (+ bias) for a few rows of x (1 <= M <= 16).

At decode batch 1..16 a linear layer is bound by reading W once (M x K x N flops against N x K
weight bytes), and cuBLAS reaches ~3.2 TB/s at these M on an H200 where a copy reaches ~4.2 TB/s.
This kernel is built to stream W: W is row-major [N, K] (as nn.Linear stores it), so each program
owns a BLOCK_N slab of output columns and walks its rows along K in BLOCK_K tiles (contiguous,
vectorised 16-byte loads, evicted first from L2); x is tiny and is re-read from L1/L2 each tile.

Split-K: when N / BLOCK_N programs are too few to fill the GPU several times over, K is cut into
SPLIT equal chunks (whole BLOCK_K tiles); grid (N / BLOCK_N, SPLIT). Each split writes its float32
partial sums to [SPLIT, M, N] and `_splitk_reduce` adds them in split order (plus the bias) and
rounds once: no atomics, so results are bit-reproducible run to run (and across SPLIT only up to
float32 summation order). With SPLIT = 1 the main kernel writes y itself.

Three ways to form the products inside a tile (`GemvConfig.mode`), all with float32 accumulation:
- "acc": a [BLOCK_M, BLOCK_N, BLOCK_K] float32 accumulator updated elementwise, reduced along K
  once at the end (no cross-thread reduction in the loop; for M = 1, 2, 4).
- "sum": elementwise products reduced along K every tile into [BLOCK_M, BLOCK_N].
  Both read x through pointers broadcast along N so x and W tiles share one register layout
  (checked in the sm_90 PTX: no shared-memory layout conversion or barrier inside the loop).
- "dot": tensor-core tl.dot with the rows of x padded to BLOCK_M = 16.
Triton's CPU interpreter (3.9) multiplies bf16 tiles wrongly in tl.dot, so under TRITON_INTERPRET=1
the dot tiles are converted to float32 first (as kernels/paged_attention.py does).

Configs come from `pick_config(M, N, K)` (kernels/gemv_configs.py: a fixed heuristic plus a table
of measured configs per shape, `TUNED`; not triton.autotune, which must not run inside the decode
forward's CUDA graphs). `gemv_ref` is the torch
reference (float32 F.linear rounded once to x's dtype). `linear(x, weight, bias)` dispatches to the
kernel on CUDA for bf16/fp16 with <= 16 rows and a contiguous weight, else to F.linear; with
`invariant=True` (the width-invariant route, models/layers.py) every GEMM of up to
INVARIANT_MAX_ROWS rows takes the "dot" kernel with one config per weight shape, rows tiled in 16s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from kernels.gemv_configs import (
    MODES,
    TUNED,
    GemvConfig,
    invariant_config,
    pick_config,
    sm_count,
)
from kernels.triton_util import INTERPRETED, to_dtype

MAX_ROWS = 16
# The width-invariant route tiles rows in 16s up to this many (a verify forward's B x (K+1) rows);
# beyond, F.linear
INVARIANT_MAX_ROWS = 1024


@triton.jit(do_not_specialize=["M", "M_TILES"])
def _gemv_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    y_ptr,
    p_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_wn,
    stride_ym,
    k_per_split,
    M_TILES,
    HAS_BIAS: tl.constexpr,
    PARTIAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    MODE: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    F32_DOT: tl.constexpr,
    IEEE: tl.constexpr,
):
    # the M tiles of one N slab are adjacent programs, so its W tile is read from DRAM once
    pid_n = tl.program_id(0) // M_TILES
    pid_m = tl.program_id(0) % M_TILES
    pid_k = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask = offs_n < N
    m_mask = offs_m < M
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    offs_k = tl.arange(0, BLOCK_K)
    w_rows = (
        offs_n.to(tl.int64) * stride_wn
    )  # int64: lm_head is ~1e9 elements; within a row K stays int32
    if MODE == "dot":
        # 2-D tiles into tl.dot (through shared memory, pipelined over num_stages)
        w_ptrs = w_ptr + w_rows[:, None] + (k_lo + offs_k)[None, :]  # [BN, BK]
        x_ptrs = x_ptr + offs_m[:, None] * stride_xm + (k_lo + offs_k)[None, :]  # [BM, BK]
        w_mask = n_mask[:, None]
        x_mask = m_mask[:, None]
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    else:
        # 3-D tiles: W [1, BN, BK], x [BM, BN, BK] read through pointers broadcast along N
        # (stride 0), so both loads get the same register layout and the products need no layout
        # conversion (through shared memory, with barriers, in every iteration); x's repeats hit L1
        w_ptrs = w_ptr + w_rows[None, :, None] + (k_lo + offs_k)[None, None, :]
        x_ptrs = (
            x_ptr
            + offs_m[:, None, None] * stride_xm
            + offs_n[None, :, None] * 0
            + (k_lo + offs_k)[None, None, :]
        )
        w_mask = n_mask[None, :, None]
        x_mask = m_mask[:, None, None]
        if MODE == "acc":
            acc3 = tl.zeros([BLOCK_M, BLOCK_N, BLOCK_K], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        if EVEN_K:
            if EVEN_N:
                w = tl.load(w_ptrs, eviction_policy="evict_first")
            else:
                w = tl.load(w_ptrs, mask=w_mask, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=x_mask, other=0.0, eviction_policy="evict_last")
        else:
            if MODE == "dot":
                k_mask = ((k0 + offs_k) < k_hi)[None, :]
            else:
                k_mask = ((k0 + offs_k) < k_hi)[None, None, :]
            w = tl.load(w_ptrs, mask=w_mask & k_mask, other=0.0, eviction_policy="evict_first")
            x = tl.load(x_ptrs, mask=x_mask & k_mask, other=0.0, eviction_policy="evict_last")
        if MODE == "dot":
            if F32_DOT:
                w = w.to(tl.float32)
                x = x.to(tl.float32)
            if IEEE:
                acc = tl.dot(x, tl.trans(w), acc, input_precision="ieee")
            else:
                acc = tl.dot(x, tl.trans(w), acc)
        elif MODE == "acc":
            acc3 += x.to(tl.float32) * w.to(tl.float32)
        else:
            acc += tl.sum(x.to(tl.float32) * w.to(tl.float32), axis=2)
        w_ptrs += BLOCK_K
        x_ptrs += BLOCK_K
    if MODE == "acc":
        acc = tl.sum(acc3, axis=2)
    out_mask = m_mask[:, None] & n_mask[None, :]
    if PARTIAL:
        p_ptrs = p_ptr + (pid_k * M + offs_m)[:, None].to(tl.int64) * N + offs_n[None, :]
        tl.store(p_ptrs, acc, mask=out_mask)
    else:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        y_ptrs = y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :]
        tl.store(y_ptrs, to_dtype(acc, y_ptr.dtype.element_ty), mask=out_mask)


@triton.jit(do_not_specialize=["SPLIT"])
def _splitk_reduce(
    p_ptr, b_ptr, y_ptr, M, N, stride_ym, SPLIT, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr
):
    """y[m, n] = sum over s in order of p[s, m, n] (+ bias[n]), rounded once; grid
    (M, cdiv(N, BLOCK))."""
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    p_ptrs = p_ptr + m * N + offs
    for _ in range(SPLIT):
        acc += tl.load(p_ptrs, mask=mask, other=0.0)
        p_ptrs += M * N
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + m * stride_ym + offs, to_dtype(acc, y_ptr.dtype.element_ty), mask=mask)


_REDUCE_BLOCK = 256  # several programs even for N = 4096 at M = 1


def _launch_args(x2, weight, bias, y, config: GemvConfig):
    M, K = x2.shape
    N = weight.shape[0]
    bk = config.block_k
    split = max(1, min(config.split, triton.cdiv(K, bk)))
    k_per_split = triton.cdiv(triton.cdiv(K, split), bk) * bk
    split = triton.cdiv(K, k_per_split)  # drop empty trailing splits
    partial = split > 1
    m_tiles = triton.cdiv(M, config.block_m(M))
    p = torch.empty((split, M, N), dtype=torch.float32, device=x2.device) if partial else y
    args = (
        x2,
        weight,
        bias if bias is not None else weight,
        y,
        p,
        M,
        N,
        K,
        x2.stride(0),
        weight.stride(0),
        y.stride(0),
        k_per_split,
        m_tiles,
    )
    kw = dict(
        HAS_BIAS=bias is not None,
        PARTIAL=partial,
        BLOCK_M=config.block_m(M),
        BLOCK_N=config.block_n,
        BLOCK_K=bk,
        MODE=config.mode,
        EVEN_K=K % bk == 0,
        EVEN_N=N % config.block_n == 0,
        F32_DOT=INTERPRETED,
        IEEE=x2.dtype == torch.float32,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    grid = (triton.cdiv(N, config.block_n) * m_tiles, split)
    return args, kw, grid, split, p


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    if weight.dim() != 2 or weight.stride(1) != 1:
        raise ValueError(
            f"weight must be [N, K] with contiguous rows, got shape {tuple(weight.shape)} "
            f"strides {weight.stride()}"
        )
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x's last dim {x.shape[-1]} != weight's K {weight.shape[1]}")
    if x.dtype != weight.dtype:
        raise ValueError(f"x is {x.dtype}, weight is {weight.dtype}")
    if bias is not None and (bias.shape != (weight.shape[0],) or bias.stride(0) != 1):
        raise ValueError(f"bias must be contiguous [N], got {tuple(bias.shape)}")


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None) -> torch.Tensor:
    """y = x @ weight^T (+ bias) through the Triton kernel: x [..., K] with <= MAX_ROWS rows (the
    product of the leading dims; up to INVARIANT_MAX_ROWS with a "dot" `config`, tiled in 16s),
    weight [N, K] with contiguous rows, same dtype (bf16, fp16 or float32); float32 accumulation,
    y in x's dtype. `config` overrides `pick_config`."""
    _check(x, weight, bias)
    lead, K, N = x.shape[:-1], x.shape[-1], weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    top = INVARIANT_MAX_ROWS if config is not None and config.mode == "dot" else MAX_ROWS
    if not 1 <= M <= top:
        raise ValueError(f"gemv takes 1..{top} rows here, got {M}")
    config = config or pick_config(M, N, K, sm_count(x.device))
    if config.mode not in MODES:
        raise ValueError(f"unknown mode {config.mode!r}")
    if x2.stride(1) != 1:
        x2 = x2.contiguous()
    y = torch.empty((M, N), dtype=x.dtype, device=x.device)
    args, kw, grid, split, p = _launch_args(x2, weight, bias, y, config)
    _gemv_kernel[grid](*args, **kw)
    if split > 1:
        _splitk_reduce[(M, triton.cdiv(N, _REDUCE_BLOCK))](
            p,
            bias if bias is not None else p,
            y,
            M,
            N,
            y.stride(0),
            split,
            HAS_BIAS=bias is not None,
            BLOCK=_REDUCE_BLOCK,
        )
    return y.reshape(*lead, N)


def warmup(M: int, weight: torch.Tensor, config: GemvConfig, bias: bool = False) -> None:
    """Compile (without running) the kernels `gemv` would launch for M rows against `weight` with
    `config`; inside `with triton.AsyncCompileMode(executor)` the compiles run in the executor."""
    N, K = weight.shape
    x2 = torch.empty((M, K), dtype=weight.dtype, device=weight.device)
    y = torch.empty((M, N), dtype=weight.dtype, device=weight.device)
    b = torch.empty(N, dtype=weight.dtype, device=weight.device) if bias else None
    args, kw, grid, split, p = _launch_args(x2, weight, b, y, config)
    _gemv_kernel.warmup(*args, grid=grid, **kw)
    if split > 1:
        _splitk_reduce.warmup(
            p,
            b if b is not None else p,
            y,
            M,
            N,
            y.stride(0),
            split,
            HAS_BIAS=bias,
            BLOCK=_REDUCE_BLOCK,
            grid=(M, triton.cdiv(N, _REDUCE_BLOCK)),
        )


def gemv_ref(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The reference: F.linear in float32, rounded once to x's dtype."""
    b = bias.float() if bias is not None else None
    return F.linear(x.float(), weight.float(), b).to(x.dtype)


def use_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
             invariant: bool = False) -> bool:
    """Whether `linear` takes the Triton GEMV for these operands: CUDA, bf16/fp16, <= 16 rows, a
    contiguous weight, and a TUNED entry for the weight's shape and the rows' bucket; with
    `invariant` any shape up to INVARIANT_MAX_ROWS rows."""
    if not (x.is_cuda and x.dtype in (torch.bfloat16, torch.float16) and weight.dtype == x.dtype):
        return False
    if (
        x.dim() == 0
        or weight.dim() != 2
        or not weight.is_contiguous()
        or x.shape[-1] != weight.shape[1]
    ):
        return False
    if bias is not None and (bias.dtype != x.dtype or bias.dim() != 1 or not bias.is_contiguous()):
        return False
    rows = x.numel() // max(1, x.shape[-1])
    if invariant:
        return 1 <= rows <= INVARIANT_MAX_ROWS
    if not 1 <= rows <= MAX_ROWS:
        return False
    # only where a measured config beat F.linear (the heuristic alone lost to cuBLAS on the H200)
    return max(1, triton.next_power_of_2(rows)) in TUNED.get(tuple(weight.shape), {})


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           invariant: bool = False) -> torch.Tensor:
    """F.linear(x, weight, bias), through the Triton GEMV when `use_gemv` (CUDA, bf16/fp16, <= 16
    rows of x, contiguous weight) and TUNED holds a measured config that beat F.linear for the
    shape and row bucket (the heuristic alone lost to cuBLAS on the H200), else F.linear itself.
    `invariant`: every GEMM of up to INVARIANT_MAX_ROWS rows takes the kernel with the one config
    of its shape (`invariant_config`), so each row's result is the same bits at any row count."""
    if use_gemv(x, weight, bias, invariant=invariant):
        config = invariant_config(weight.shape[0], weight.shape[1], sm_count(x.device)) \
            if invariant else None
        return gemv(x, weight, bias, config)
    return F.linear(x, weight, bias)
