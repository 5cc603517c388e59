"""Counter-based sampling randomness keyed by (seed, logical position, purpose).

One uniform in [0, 1) per (seed, position, purpose), computed by a fixed integer hash, so a draw
never depends on the batch row, the batch size, the device or the order of calls: a request's random
stream survives compaction, pausing and replay (design document: "The RNG split by seed, logical
position and purpose continues, and a changing compact row never resets a request's random
stream"). Grammars, masks and rollbacks consume no randomness: nothing here has state.

The hash (all arithmetic on unsigned 32-bit words, wrapping):

    fmix32(x):   x ^= x >> 16; x *= 0x85EBCA6B; x ^= x >> 13; x *= 0xC2B2AE35; x ^= x >> 16
    h = fmix32(0x243F6A88 ^ purpose)                      # purpose_key(purpose), a host constant
    for w in (seed_lo, seed_hi, position_hi, position_lo):   # two's-complement 64-bit halves
        h = fmix32(h ^ w)
    h = fmix32(h ^ 0x9E3779B9)
    u = (h >> 8) * 2**-24                                 # 24 bits: exact in float32, u < 1

fmix32 is MurmurHash3's finaliser (a bijection with full avalanche); every input word passes at
least two rounds. `kernels.sampling` computes the same words in Triton (`_uniform`), and this module
computes them with int64 torch arithmetic (products split so that nothing overflows).
"""

from __future__ import annotations

from enum import IntEnum

import torch

MASK32 = 0xFFFFFFFF
_IV = 0x243F6A88  # first digits of pi
_FINAL = 0x9E3779B9  # golden ratio
_M1 = 0x85EBCA6B
_M2 = 0xC2B2AE35
UNIFORM_BITS = 24


class Purpose(IntEnum):
    """Independent random streams of one (seed, position). Values are part of the hash: never
    reuse."""

    SAMPLE = 0  # ordinary sampling of the next token
    ACCEPT = 1  # speculative acceptance test
    RESIDUAL = 2  # speculative residual resampling after a rejection
    DRAFT = 3  # a drafter's own sampling (DFlash2's candidate walk at T > 0)


def fmix32_int(x: int) -> int:
    """MurmurHash3 finaliser on a Python int holding an unsigned 32-bit word."""
    x ^= x >> 16
    x = (x * _M1) & MASK32
    x ^= x >> 13
    x = (x * _M2) & MASK32
    x ^= x >> 16
    return x


def purpose_key(purpose: int) -> int:
    """The hash state after absorbing `purpose` (0 <= purpose < 2**32), a host constant per
    stream."""
    if not 0 <= int(purpose) <= MASK32:
        raise ValueError(f"purpose must be in [0, 2**32), got {purpose}")
    return fmix32_int(_IV ^ int(purpose))


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    # x: int64 holding [0, 2**32); low 32 bits of x * c without int64 overflow.
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _M1)
    x = x ^ (x >> 13)
    x = _mul32(x, _M2)
    return x ^ (x >> 16)


def hash32(seed: torch.Tensor, position: torch.Tensor, purpose: int) -> torch.Tensor:
    """The 32-bit hash word per element, as int64 in [0, 2**32).

    seed, position: int64 tensors of one shape (any values; their two's-complement bits are hashed).
    Raises ValueError for a purpose outside [0, 2**32)."""
    seed = seed.to(torch.int64)
    position = position.to(torch.int64)
    h = torch.full_like(seed, purpose_key(purpose))
    for word in (
        seed & MASK32,
        (seed >> 32) & MASK32,
        (position >> 32) & MASK32,
        position & MASK32,
    ):
        h = _fmix32(h ^ word)
    return _fmix32(h ^ _FINAL)


def uniform(
    seed: torch.Tensor, position: torch.Tensor, purpose: int = Purpose.SAMPLE
) -> torch.Tensor:
    """One float32 uniform in [0, 1) per (seed, position) element for the given purpose stream.

    Multiples of 2**-24, so the value is exact in float32 and identical on every device."""
    h = hash32(seed, position, purpose)
    return (h >> (32 - UNIFORM_BITS)).to(torch.float32) * (2.0 ** -UNIFORM_BITS)
