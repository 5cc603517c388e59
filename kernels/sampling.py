"""Triton sampling kernel family: penalties, legal mask, temperature, top-k, min-p, top-p, greedy.

The contract (inputs, rule, statuses) is in `kernels.sampling_contract`; `kernels.sampling_ref` is
the plain-torch reference. The work is split in three steps, no host sync between them:

1. `_keys_kernel`, grid (N, ceil(V/BLOCK_V)): reads logits and, for constrained rows only, the
   packed mask words; writes one int64 sort key per (row, token)
       key = ordered_bits(z if legal else -inf) << 32 | (2**31 - 1 - token)
   so that a larger key means a larger value and, among equal values, the smaller id (-0.0 is
   folded into +0.0); and per-block stats [N, NB, 2]: legal count and legal NaN/+inf count.
   `_penalty_kernel`, grid (N, ceil(L/BLOCK_L)), then rewrites the keys of the row's seen tokens
   whose value is finite (illegal tokens are -inf and stay so; NaN/inf stay what they are).
2. `torch.topk(keys, width)`: candidate selection over legal tokens only. Keys are unique, so the
   order is fully determined (value descending, ties to the smaller id) whatever topk's algorithm;
   width V is a full sort. A greedy-only batch passes width 1, an argmax: no top-k runs; without
   penalties the keys are not even stored, `_keys_kernel` writes each block's largest key and
   one `amax` over the blocks gives the row's (with penalties, `amax` over the stored keys).
3. `_sample_kernel`, grid (N,): reduces the stats to the row's status, takes the first candidate
   for T = 0, otherwise walks the sorted candidates in chunks: weights exp((z - z_max) / T) (the
   design's exp(z/T - max z/T), computed without overflow), top-k and support, min-p, top-p with a
   running prefix sum, then the inverse CDF at the counter-based uniform (`kernels.rng`, same
   words).

On CPU use the reference, or this module under Triton's interpreter: TRITON_INTERPRET=1 must be
in the environment before triton itself is first imported (checked with triton 3.9:
triton.language's own helpers such as tl.sum are jit functions decorated at import, so switching the
variable later, or loading a second copy of this module, fails with "Cannot call @triton.jit'd
outside of the scope of a kernel"); the tests therefore run the interpreter in a child process.
Triton 3.6's interpreter (the GPU image's) rejects the runtime loop bounds used here; its compiled
kernels pass.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels import rng
from kernels.sampling_contract import PenaltyHistory, SampleResult, SamplingParams, check_inputs

_NEG_INF = tl.constexpr(float("-inf"))
_POS_INF = tl.constexpr(float("inf"))
_MIN_KEY = tl.constexpr(-2**63)


@triton.jit
def _ordered(z):
    # float32 -> int32 whose signed order is the float order (-0.0 must be folded beforehand).
    bits = z.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)


@triton.jit
def _key_value(key):
    # Inverse of _ordered on the key's high word: the float32 value.
    ordered = (key >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _make_key(z, token):
    z = tl.where(z == 0.0, 0.0, z)
    return (_ordered(z).to(tl.int64) << 32) | (0x7FFFFFFF - token).to(tl.int64)


@triton.jit
def _fmix32(x):
    x ^= x >> 16
    x *= 0x85EBCA6B
    x ^= x >> 13
    x *= 0xC2B2AE35
    x ^= x >> 16
    return x


@triton.jit
def _uniform(seed, position, PURPOSE_KEY: tl.constexpr):
    # kernels.rng: h = purpose_key; absorb seed lo/hi, position hi/lo; final round; top 24 bits.
    s = seed.to(tl.uint64, bitcast=True)
    p = position.to(tl.uint64, bitcast=True)
    h = _fmix32((s & 0xFFFFFFFF).to(tl.uint32) ^ PURPOSE_KEY)
    h = _fmix32(h ^ (s >> 32).to(tl.uint32))
    h = _fmix32(h ^ (p >> 32).to(tl.uint32))
    h = _fmix32(h ^ (p & 0xFFFFFFFF).to(tl.uint32))
    h = _fmix32(h ^ 0x9E3779B9)
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _keys_kernel(logits_ptr, logits_stride, mask_ptr, mask_stride, mask_row_ptr, keys_ptr,
                 keys_stride, stats_ptr, blockmax_ptr, V, NB,
                 HAS_MASK: tl.constexpr, STORE_KEYS: tl.constexpr, BLOCK_MAX: tl.constexpr,
                 BLOCK_V: tl.constexpr):
    n = tl.program_id(0)
    blk = tl.program_id(1)
    v = blk * BLOCK_V + tl.arange(0, BLOCK_V)  # [BLOCK_V] token ids
    in_vocab = v < V
    z = tl.load(logits_ptr + n.to(tl.int64) * logits_stride + v, mask=in_vocab,
                other=_NEG_INF).to(tl.float32)
    if HAS_MASK:
        row = tl.load(mask_row_ptr + n + v * 0)  # [BLOCK_V], -1: unconstrained, mask not read
        word = tl.load(mask_ptr + row.to(tl.int64) * mask_stride + v // 32,
                       mask=in_vocab & (row >= 0), other=0)
        legal = in_vocab & ((((word >> (v % 32)) & 1) != 0) | (row < 0))
    else:
        legal = in_vocab
    key = _make_key(tl.where(legal, z, _NEG_INF), v)
    if STORE_KEYS:
        tl.store(keys_ptr + n.to(tl.int64) * keys_stride + v, key, mask=in_vocab)
    if BLOCK_MAX:  # the block's largest key: its argmax, ties to the smaller id
        tl.store(blockmax_ptr + n * NB + blk, tl.max(tl.where(in_vocab, key, _MIN_KEY), axis=0))
    bad = legal & ((z != z) | (z == _POS_INF))
    stats = stats_ptr + (n * NB + blk) * 2
    tl.store(stats, tl.sum(legal.to(tl.int32), axis=0))
    tl.store(stats + 1, tl.sum(bad.to(tl.int32), axis=0))


@triton.jit
def _penalty_kernel(keys_ptr, keys_stride, ids_ptr, ids_stride, counts_ptr, counts_stride,
                    rep_ptr, presence_ptr, frequency_ptr, L, V, ROWS_PER_PARAM,
                    BLOCK_L: tl.constexpr):
    n = tl.program_id(0)
    prm = n // ROWS_PER_PARAM
    j = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)  # [BLOCK_L] history slots
    ids = tl.load(ids_ptr + n * ids_stride + j, mask=j < L, other=-1)
    count = tl.load(counts_ptr + n * counts_stride + j, mask=j < L, other=0)
    seen = (ids >= 0) & (ids < V)
    row_keys = keys_ptr + n.to(tl.int64) * keys_stride
    z = _key_value(tl.load(row_keys + ids, mask=seen, other=0))
    finite = (z == z) & (tl.abs(z) < _POS_INF)  # legal and finite: illegal keys hold -inf
    rep = tl.load(rep_ptr + prm)
    z = tl.where(z > 0, z / rep, z * rep)
    z = z - tl.load(presence_ptr + prm) * (count > 0).to(tl.float32)
    z = z - tl.load(frequency_ptr + prm) * count.to(tl.float32)
    tl.store(row_keys + ids, _make_key(z, ids), mask=seen & finite)


@triton.jit
def _candidate_weights(row, i, k, z0, t, min_p):
    # Weights of candidates i (sorted keys of one row) after top-k, support (> 0) and min-p.
    z = tl.where(i < k, _key_value(tl.load(row + i, mask=i < k, other=0)), _NEG_INF)
    w = tl.exp((z - z0) / t)
    return tl.where((w > 0) & (w >= min_p), w, 0.0)


@triton.jit
def _sample_kernel(cand_ptr, cand_stride, width, stats_ptr, NB, temperature_ptr, top_k_ptr,
                   top_p_ptr, min_p_ptr, seed_ptr, position_ptr,
                   token_ptr, status_ptr, prob_ptr, uniform_ptr,
                   PURPOSE_KEY: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_NB: tl.constexpr):
    n = tl.program_id(0)
    legal = tl.zeros([BLOCK_NB], tl.int32)
    bad = tl.zeros([BLOCK_NB], tl.int32)
    for start in range(0, NB, BLOCK_NB):
        b = start + tl.arange(0, BLOCK_NB)
        legal += tl.load(stats_ptr + (n * NB + b) * 2, mask=b < NB, other=0)
        bad += tl.load(stats_ptr + (n * NB + b) * 2 + 1, mask=b < NB, other=0)
    row = cand_ptr + n.to(tl.int64) * cand_stride
    z0 = _key_value(tl.load(row))
    status = tl.where(tl.sum(legal, axis=0) == 0, 1,
                      tl.where((tl.sum(bad, axis=0) > 0) | (z0 == _NEG_INF), 2, 0))
    z0 = tl.where(status == 0, z0, 0.0)  # failed rows: keep the arithmetic below finite
    u = _uniform(tl.load(seed_ptr + n), tl.load(position_ptr + n), PURPOSE_KEY)
    temp = tl.load(temperature_ptr + n)
    k = tl.load(top_k_ptr + n)
    k = tl.where((k <= 0) | (k > width), width, k)
    k = tl.where((status == 0) & (temp > 0), k, 0)  # greedy and failed rows skip the walk
    t = tl.where(temp > 0, temp, 1.0)
    min_p = tl.load(min_p_ptr + n)
    top_p = tl.load(top_p_ptr + n)
    # Pass 1: total weight after top-k, support and min-p.
    total1 = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, k, BLOCK_W):
        total1 += _candidate_weights(row, start + tl.arange(0, BLOCK_W), k, z0, t, min_p)
    limit = tl.where(top_p >= 1.0, _POS_INF, top_p * tl.sum(total1, axis=0))
    # Pass 2: top-p keeps a candidate while the kept weight before it is < top_p of the total.
    carry = 0.0
    total2 = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, k, BLOCK_W):
        w = _candidate_weights(row, start + tl.arange(0, BLOCK_W), k, z0, t, min_p)
        before = carry + tl.cumsum(w, axis=0) - w
        total2 += tl.where(before < limit, w, 0.0)
        carry += tl.sum(w, axis=0)
    total = tl.sum(total2, axis=0)
    # Pass 3: inverse CDF, the first kept candidate whose cumulative weight exceeds u * total.
    target = u * total
    carry = 0.0
    kept_carry = 0.0
    chosen = n * 0 + width
    last = n * 0
    for start in range(0, k, BLOCK_W):
        i = start + tl.arange(0, BLOCK_W)
        w = _candidate_weights(row, i, k, z0, t, min_p)
        before = carry + tl.cumsum(w, axis=0) - w
        kept = (w > 0) & (before < limit)
        w2 = tl.where(kept, w, 0.0)
        cum = kept_carry + tl.cumsum(w2, axis=0)
        chosen = tl.minimum(chosen, tl.min(tl.where(kept & (cum > target), i, width), axis=0))
        last = tl.maximum(last, tl.max(tl.where(kept, i, 0), axis=0))
        carry += tl.sum(w, axis=0)
        kept_carry += tl.sum(w2, axis=0)
    chosen = tl.where(chosen >= width, last, chosen)  # rounding: u * total reached the end
    key = tl.load(row + chosen)
    w = tl.exp((tl.where(status == 0, _key_value(key), 0.0) - z0) / t)
    prob = tl.where(temp > 0, w / tl.where(total > 0, total, 1.0), 1.0)
    token = (0x7FFFFFFF - (key & 0xFFFFFFFF)).to(tl.int64)
    tl.store(token_ptr + n, tl.where(status == 0, token, 0))
    tl.store(status_ptr + n, status)
    tl.store(prob_ptr + n, tl.where(status == 0, prob, 0.0))
    tl.store(uniform_ptr + n, u)


def sample(logits: torch.Tensor, params: SamplingParams, *, vocab_size: int,
           mask: torch.Tensor | None = None, mask_row: torch.Tensor | None = None,
           penalties: PenaltyHistory | None = None, purpose: int = rng.Purpose.SAMPLE,
           candidate_width: int | None = None, block_v: int = 1024) -> SampleResult:
    """Sample one token per logits row with the legal mask fused before candidate selection.

    logits: [N, V_pad] (float32 / bf16 / fp16, unit column stride), only columns < vocab_size read.
    mask: int32 [..., ceil(V/32)] packed words, leading dims flattened to mask rows (a `[B, K+1, W]`
        speculative buffer works as is); None = every row unconstrained, no mask code runs.
    mask_row: int32 [N], the mask row of each logits row, -1 = unconstrained (mask not read).
    penalties: sparse seen-token history (see `PenaltyHistory`), None = no penalties.
    purpose: the RNG stream (`kernels.rng.Purpose`), default SAMPLE.
    candidate_width: how many sorted candidates are built (default V, a full sort); rows with top_k
        0 or above it are cut to it, so pass max(top_k) when every sampled row has top_k > 0, and 1
        for a greedy-only batch.
    block_v: vocabulary tile of the first kernel (a power of two >= 32).
    Returns SampleResult (tokens, status, prob, uniform). Raises ValueError for inconsistent shapes,
    dtypes, devices or widths. No host synchronisation."""
    flat_mask = check_inputs(logits, params, vocab_size, mask, mask_row, penalties)
    width = vocab_size if candidate_width is None else candidate_width
    n, device = logits.shape[0], logits.device
    tokens = torch.empty(n, dtype=torch.int64, device=device)
    status = torch.empty(n, dtype=torch.int32, device=device)
    prob = torch.empty(n, dtype=torch.float32, device=device)
    u = torch.empty(n, dtype=torch.float32, device=device)
    candidates, stats = build_candidates(logits, params, vocab_size, flat_mask, mask_row, penalties,
                                         width, block_v)
    if n == 0:
        return SampleResult(tokens=tokens, status=status, prob=prob, uniform=u)
    nb = stats.shape[1]
    _sample_kernel[(n,)](
        candidates, candidates.stride(0), width, stats, nb, params.temperature, params.top_k,
        params.top_p, params.min_p, params.seed, params.position, tokens, status, prob, u,
        PURPOSE_KEY=rng.purpose_key(purpose),
        BLOCK_W=min(triton.next_power_of_2(width), 1024),
        BLOCK_NB=min(triton.next_power_of_2(nb), 1024))
    return SampleResult(tokens=tokens, status=status, prob=prob, uniform=u)


def build_candidates(logits: torch.Tensor, params: SamplingParams, vocab_size: int,
                     flat_mask: torch.Tensor | None, mask_row: torch.Tensor | None,
                     penalties: PenaltyHistory | None, width: int, block_v: int = 1024,
                     rows_per_param: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps 1 and 2 of the module docstring for N logits rows: (candidates [N, width] int64
    sorted keys, stats [N, NB, 2] int32). Logits row n takes the penalties of parameter row
    n // rows_per_param (the speculative layout: K+1 positions per parameter row). Inputs as
    checked by `check_inputs` (flat_mask is its result). Raises ValueError for a bad width or
    block_v."""
    if not 1 <= width <= vocab_size:
        raise ValueError(f"candidate_width: expected 1..{vocab_size}, got {width}")
    if block_v < 32 or block_v & (block_v - 1):
        raise ValueError(f"block_v: expected a power of two >= 32, got {block_v}")
    n, device = logits.shape[0], logits.device
    nb = triton.cdiv(vocab_size, block_v)
    # Greedy-only width 1 is an argmax: without penalties the keys are never stored, each block
    # reports its largest key and one reduction picks the row's; no top-k runs.
    penalized = penalties is not None and penalties.ids.shape[1] > 0
    argmax = width == 1
    store_keys = not argmax or penalized
    keys = torch.empty(n if store_keys else 0, vocab_size, dtype=torch.int64, device=device)
    blockmax = torch.empty(n, nb if argmax and not penalized else 0, dtype=torch.int64,
                           device=device)  # [N, NB] block maxima of the keys
    stats = torch.empty(n, nb, 2, dtype=torch.int32, device=device)  # [N, NB, (legal, bad)]
    if n == 0:
        return torch.empty(0, width, dtype=torch.int64, device=device), stats
    has_mask = flat_mask is not None
    _keys_kernel[(n, nb)](
        logits, logits.stride(0), flat_mask if has_mask else keys,
        flat_mask.stride(0) if has_mask else 0, mask_row if has_mask else stats, keys,
        keys.stride(0) if store_keys else 0, stats, blockmax, vocab_size, nb, HAS_MASK=has_mask,
        STORE_KEYS=store_keys, BLOCK_MAX=argmax and not penalized, BLOCK_V=block_v)
    if penalized:
        hist = penalties.ids.shape[1]
        block_l = min(triton.next_power_of_2(hist), 1024)
        _penalty_kernel[(n, triton.cdiv(hist, block_l))](
            keys, keys.stride(0), penalties.ids, penalties.ids.stride(0), penalties.counts,
            penalties.counts.stride(0), params.repetition_penalty, params.presence_penalty,
            params.frequency_penalty, hist, vocab_size, rows_per_param, BLOCK_L=block_l)
    if not argmax:
        return torch.topk(keys, width, dim=1, largest=True, sorted=True).values, stats  # [N, W]
    return (keys if penalized else blockmax).amax(dim=1, keepdim=True), stats  # [N, 1]
