"""Configs of the decode GEMV (kernels/gemv.py): the tile and split choice `GemvConfig`, and how
`pick_config(M, N, K)` chooses one: the table of measured configs per shape (`TUNED`, filled from
`python -m bench.gemv_sweep`) where it has the shape, else a fixed heuristic with split-K from
`choose_split`. Not triton.autotune: the decode forward runs inside CUDA graphs, where autotune's
benchmarking must not run.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

import torch
import triton

MODES = ("acc", "sum", "dot")  # how a tile forms its products (kernels/gemv.py)


@dataclass(frozen=True)
class GemvConfig:
    block_n: int
    block_k: int
    split: int = 1
    num_warps: int = 4
    num_stages: int = 2
    mode: str = "acc"

    def block_m(self, M: int) -> int:
        return 16 if self.mode == "dot" else max(1, triton.next_power_of_2(M))

    def as_dict(self) -> dict:
        return asdict(self)


@functools.lru_cache(maxsize=None)
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device (132 on an H100 SXM / H200), 132 off CUDA."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def choose_split(M: int, N: int, K: int, block_n: int, block_k: int, sms: int = 132, waves: int = 4,
                 min_tiles: int = 4) -> int:
    """The smallest power-of-two SPLIT giving >= waves x sms programs, keeping >= min_tiles BLOCK_K
    tiles per split (so short K is not cut into slivers)."""
    slabs = triton.cdiv(N, block_n)
    split = 1
    while slabs * split < waves * sms and triton.cdiv(K, 2 * split * block_k) >= min_tiles:
        split *= 2
    return split


# Measured best configs, keyed (N, K) -> {row bucket: GemvConfig}; a bucket is next_power_of_2(M).
# Filled from `python -m bench.gemv_sweep` on the target GPU (empty: the heuristic alone).
# Measured on one H200 (2026-12-01, `python -m bench.gemv_sweep --budget 60`, CUDA-graph replays,
# weights rotated past L2): the best swept config of each (N, K) and row bucket where it beat
# F.linear (cuBLAS) by >= 3%, with its speedup. `linear` takes the kernel only for these.
TUNED: dict[tuple[int, int], dict[int, GemvConfig]] = {
    (4096, 4096): {
        1: GemvConfig(32, 128, 8, 4, 2, 'acc'),  # x1.07
        4: GemvConfig(128, 128, 4, 4, 4, 'dot'),  # x1.03
    },
    (24576, 4096): {
        8: GemvConfig(64, 128, 1, 4, 4, 'dot'),  # x1.10
    },
    (4096, 12288): {
        1: GemvConfig(64, 128, 4, 4, 3, 'dot'),  # x1.06
        2: GemvConfig(64, 128, 4, 4, 3, 'dot'),  # x1.06
        4: GemvConfig(64, 128, 4, 4, 3, 'dot'),  # x1.06
        8: GemvConfig(64, 128, 4, 4, 3, 'dot'),  # x1.06
    },
    (248320, 4096): {
        1: GemvConfig(128, 128, 1, 4, 4, 'dot'),  # x1.09
        2: GemvConfig(128, 128, 1, 4, 4, 'dot'),  # x1.09
        4: GemvConfig(128, 128, 1, 4, 4, 'dot'),  # x1.09
        8: GemvConfig(128, 128, 1, 4, 4, 'dot'),  # x1.09
        16: GemvConfig(128, 128, 1, 4, 4, 'dot'),  # x1.09
    },
    (12352, 4096): {
        1: GemvConfig(32, 128, 1, 4, 4, 'dot'),  # x1.12
        2: GemvConfig(32, 128, 1, 4, 4, 'dot'),  # x1.13
        4: GemvConfig(32, 128, 1, 4, 4, 'dot'),  # x1.12
        8: GemvConfig(32, 128, 1, 4, 4, 'dot'),  # x1.13
        16: GemvConfig(32, 128, 1, 4, 4, 'dot'),  # x1.12
    },
}


def pick_config(M: int, N: int, K: int, sms: int = 132) -> GemvConfig:
    """The config for an [M, K] x [N, K]^T product: TUNED's entry for the shape and row bucket when
    there is one, else the heuristic: M <= 2 elementwise float32 accumulation over [BM, BN, BK]
    (64 float32 accumulators per thread at 4 warps), M > 2 tensor-core dot with rows padded to 16;
    BLOCK_K = 128 bf16 (256 bytes a row per tile), SPLIT from `choose_split`."""
    bucket = max(1, triton.next_power_of_2(M))
    tuned = TUNED.get((N, K), {}).get(bucket)
    if tuned is not None:
        return tuned
    if bucket == 1:
        bn, bk, warps, stages, mode = 64, 128, 4, 2, "acc"
    elif bucket == 2:
        bn, bk, warps, stages, mode = 32, 128, 4, 2, "acc"
    else:
        bn, bk, warps, stages, mode = 64, 128, 4, 4, "dot"
    return GemvConfig(bn, bk, choose_split(M, N, K, bn, bk, sms), warps, stages, mode)


# The width-invariant route (kernels/gemv.py `linear(..., invariant=True)`): one config per (N, K)
# for every row count, so a row's product does not depend on how many rows share the GEMM (a
# decode step's B rows, a verify forward's B x (K+1)). Tensor-core tiles of 16 rows ("dot"): a
# row's float32 accumulation runs over the same K tiles in the same order whichever tile of 16 it
# lands in and whatever the other rows hold; SPLIT fixed, so the split-K partials are summed in
# the same order. Measured per shape on the H200 (bench/width_invariance.py --sweep) where listed,
# else `invariant_config`'s rule.
INVARIANT: dict[tuple[int, int], GemvConfig] = {}


def invariant_config(N: int, K: int, sms: int = 132) -> GemvConfig:
    """The one config of the width-invariant route for [*, K] x [N, K]^T: INVARIANT's entry, else
    TUNED's dot config of the smallest row bucket (decode at batch 1 matters most), else the
    heuristic dot tile with the split `choose_split` gives one row."""
    if (N, K) in INVARIANT:
        return INVARIANT[(N, K)]
    for bucket in sorted(TUNED.get((N, K), {})):
        config = TUNED[(N, K)][bucket]
        if config.mode == "dot":
            return config
    return GemvConfig(64, 128, choose_split(1, N, K, 64, 128, sms), 4, 4, "dot")
