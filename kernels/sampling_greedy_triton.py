"""Greedy sampling (T = 0, no penalties) as one pass of Triton over the logits: the masked argmax.

`kernels.sampling_greedy.sample_greedy` (plain torch) is the reference and the CPU path; this
computes exactly its result, `kernels.sampling_contract`'s rule for T = 0: the largest legal logit,
ties to the smaller id; DEAD_END when the legal set A is empty; NONFINITE when a legal value is NaN
or +inf or every legal value is -inf; illegal values are never inspected. Two launches, no host
synchronisation, fixed shapes (capturable in a CUDA graph):

1. `_greedy_partial_kernel`, grid (N, C), C = ceil(V / BLOCK_V): each program reads one chunk of
   BLOCK_V logits of one row (as a [BLOCK_V / 32, 32] tile, so each packed mask word is loaded
   once and its 32 bits expand in registers), the constrained row's mask words, and the static
   `generable` words, and writes the chunk's partial: the largest inspected value (NaN and
   non-generable ids count as -inf), the smallest id holding it, and flags (bit 0: some id of the
   chunk is legal, bit 1: a legal, generable value is NaN or +inf).
2. `_greedy_combine_kernel`, grid (N,): reduces the C partials of a row with the same tie rule
   (larger value, then smaller id) and writes token, status, prob and uniform (0: greedy draws
   none).

The `generable` words replace the sampler's copy of the logits with never-generable ids at -inf
(`services.worker.program.sampling.Sampler._generable`): an id whose bit is clear is read as -inf,
so it still counts as legal for DEAD_END (as the -inf copy does) but is never the token and its
value is never inspected for NaN / +inf.

On CPU this runs under Triton's interpreter only (TRITON_INTERPRET=1 before triton's first import;
see `kernels.sampling`); the tests run it in a child process.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.sampling_contract import SampleResult, SampleStatus, mask_words

_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))
_NO_ID = tl.constexpr(2**31 - 1)
_OK = tl.constexpr(int(SampleStatus.OK))
_DEAD_END = tl.constexpr(int(SampleStatus.DEAD_END))
_NONFINITE = tl.constexpr(int(SampleStatus.NONFINITE))


@triton.jit
def _greedy_partial_kernel(logits_ptr, logits_stride, mask_ptr, mask_stride, mask_row_ptr,
                           generable_ptr, value_ptr, index_ptr, flags_ptr, V, W, C,
                           HAS_MASK: tl.constexpr, HAS_GENERABLE: tl.constexpr,
                           BLOCK_V: tl.constexpr):
    n = tl.program_id(0)
    c = tl.program_id(1)
    w = c * (BLOCK_V // 32) + tl.arange(0, BLOCK_V // 32)  # [BW] mask word indices
    bit = tl.arange(0, 32)  # [32]
    v = w[:, None] * 32 + bit[None, :]  # [BW, 32] token ids, row-major = memory order
    in_vocab = v < V
    in_words = w < W
    z = tl.load(logits_ptr + n.to(tl.int64) * logits_stride + v, mask=in_vocab,
                other=_NEG_INF).to(tl.float32)
    if HAS_MASK:
        # [BW] copies of the row's descriptor (a vector: the interpreter rejects a scalar in a
        # load mask); -1: unconstrained, its mask is never read
        row = tl.load(mask_row_ptr + n + w * 0)
        word = tl.load(mask_ptr + row.to(tl.int64) * mask_stride + w, mask=in_words & (row >= 0),
                       other=0)
        legal = in_vocab & ((((word[:, None] >> bit[None, :]) & 1) != 0) | (row[:, None] < 0))
    else:
        legal = in_vocab
    if HAS_GENERABLE:
        gen = tl.load(generable_ptr + w, mask=in_words, other=0)
        inspected = legal & (((gen[:, None] >> bit[None, :]) & 1) != 0)
    else:
        inspected = legal
    bad = inspected & ((z != z) | (z == _POS_INF))
    zl = tl.where(inspected & (z == z), z, _NEG_INF)
    best = tl.max(tl.max(zl, axis=1), axis=0)
    first = tl.min(tl.min(tl.where(zl == best, v, _NO_ID), axis=1), axis=0)
    any_legal = tl.max(tl.max(legal.to(tl.int32), axis=1), axis=0)
    any_bad = tl.max(tl.max(bad.to(tl.int32), axis=1), axis=0)
    out = n * C + c
    tl.store(value_ptr + out, best)
    tl.store(index_ptr + out, first)
    tl.store(flags_ptr + out, any_legal | (any_bad << 1))


@triton.jit
def _greedy_combine_kernel(value_ptr, index_ptr, flags_ptr, token_ptr, status_ptr, prob_ptr,
                           uniform_ptr, C, HAS_MASK: tl.constexpr, BLOCK_C: tl.constexpr):
    n = tl.program_id(0)
    best = tl.full([BLOCK_C], _NEG_INF, tl.float32)
    first = tl.full([BLOCK_C], _NO_ID, tl.int32)
    flags = tl.zeros([BLOCK_C], tl.int32)
    for start in range(0, C, BLOCK_C):
        c = start + tl.arange(0, BLOCK_C)
        val = tl.load(value_ptr + n * C + c, mask=c < C, other=_NEG_INF)
        idx = tl.load(index_ptr + n * C + c, mask=c < C, other=_NO_ID)
        better = (val > best) | ((val == best) & (idx < first))
        best = tl.where(better, val, best)
        first = tl.where(better, idx, first)
        flags |= tl.load(flags_ptr + n * C + c, mask=c < C, other=0)
    top = tl.max(best, axis=0)
    token = tl.min(tl.where(best == top, first, _NO_ID), axis=0)  # ties to the smaller id
    any_legal = tl.max(flags & 1, axis=0)
    any_bad = tl.max((flags >> 1) & 1, axis=0)
    status = tl.where((any_bad != 0) | (top == _NEG_INF), _NONFINITE, _OK)
    if HAS_MASK:
        status = tl.where(any_legal == 0, _DEAD_END, status)
    ok = status == _OK
    tl.store(token_ptr + n, tl.where(ok, token, 0).to(tl.int64))
    tl.store(status_ptr + n, status.to(tl.int32))
    tl.store(prob_ptr + n, tl.where(ok, 1.0, 0.0))
    tl.store(uniform_ptr + n, 0.0)


def default_block(rows: int) -> int:
    """Columns per program: 2048 at every batch size. Measured on an H200 at V = 248,320, bf16,
    graph-replayed (`python -m bench.kernel_speed --only sampling_greedy`): 2048 was the
    fastest block at B = 1, 8 and 64, masked or not (B = 64 masked: 41 us at 2048, 44 at 4096,
    65 at 8192; the torch path 319 us). `rows` stays for a shape-dependent choice."""
    return 2048


def sample_greedy_triton(
    logits: torch.Tensor,
    *,
    vocab_size: int,
    mask: torch.Tensor | None = None,
    mask_row: torch.Tensor | None = None,
    generable: torch.Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> SampleResult:
    """One greedy token per row of logits [N, V_pad] (float32 / bf16 / fp16, unit column stride,
    any row stride; only the first vocab_size columns are read), no penalties.

    mask: packed int32 words [..., ceil(V/32)] flattening to mask rows, with mask_row [N] int32
    (-1 = unconstrained), or both None. generable: packed int32 words [ceil(V/32)] of the ids that
    may be chosen (the others read as -inf), or None = all. block_v: columns per program (a power
    of two >= 32; default `default_block(N)`). Returns what `sample_greedy` returns for the same
    logits with the non-generable ids at -inf. Raises ValueError for inconsistent inputs."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [N, V_pad] with unit column stride, got "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if logits.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"logits: expected float32 / bfloat16 / float16, got {logits.dtype}")
    n, width = logits.shape
    if not 1 <= vocab_size <= width or vocab_size >= 2**31 - 1:
        raise ValueError(f"vocab_size: expected 1 <= V <= {width} (logits width), got {vocab_size}")
    words = mask_words(vocab_size)
    device = logits.device
    if mask is not None:
        if mask.dtype != torch.int32 or mask.dim() < 2 or mask.shape[-1] != words \
                or mask.device != device:
            raise ValueError(f"mask: expected int32 [..., {words}] on {device}, got {mask.dtype} "
                             f"{tuple(mask.shape)} on {mask.device}")
        if mask_row is None or mask_row.shape != (n,) or mask_row.dtype != torch.int32 \
                or mask_row.device != device:
            raise ValueError(f"mask_row: expected int32 [{n}] on {device} with a mask")
        mask = mask.view(-1, words)
    elif mask_row is not None:
        raise ValueError("mask_row was given without a mask")
    if generable is not None and (generable.shape != (words,) or generable.dtype != torch.int32
                                  or generable.device != device):
        raise ValueError(f"generable: expected int32 [{words}] on {device}, got "
                         f"{generable.dtype} {tuple(generable.shape)} on {generable.device}")
    block = default_block(n) if block_v is None else block_v
    if block < 32 or block & (block - 1):
        raise ValueError(f"block_v: expected a power of two >= 32, got {block}")
    chunks = triton.cdiv(vocab_size, block)
    tokens = torch.empty(n, dtype=torch.int64, device=device)
    status = torch.empty(n, dtype=torch.int32, device=device)
    prob = torch.empty(n, dtype=torch.float32, device=device)
    uniform = torch.empty(n, dtype=torch.float32, device=device)
    if n == 0:
        return SampleResult(tokens=tokens, status=status, prob=prob, uniform=uniform)
    value = torch.empty(n, chunks, dtype=torch.float32, device=device)
    index = torch.empty(n, chunks, dtype=torch.int32, device=device)
    flags = torch.empty(n, chunks, dtype=torch.int32, device=device)
    has_mask = mask is not None
    warps = num_warps or (4 if block <= 4096 else 8)
    _greedy_partial_kernel[(n, chunks)](
        logits, logits.stride(0), mask if has_mask else flags, mask.stride(0) if has_mask else 0,
        mask_row if has_mask else flags, generable if generable is not None else flags,
        value, index, flags, vocab_size, words, chunks, HAS_MASK=has_mask,
        HAS_GENERABLE=generable is not None, BLOCK_V=block, num_warps=warps)
    _greedy_combine_kernel[(n,)](
        value, index, flags, tokens, status, prob, uniform, chunks, HAS_MASK=has_mask,
        BLOCK_C=min(triton.next_power_of_2(chunks), 1024))
    return SampleResult(tokens=tokens, status=status, prob=prob, uniform=uniform)
