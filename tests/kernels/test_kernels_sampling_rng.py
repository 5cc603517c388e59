"""The counter-based RNG of the sampling kernels against a plain-Python transcription of its
spec."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels import rng

M32 = 0xFFFFFFFF


def _fmix(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x85EBCA6B) & M32
    x ^= x >> 13
    x = (x * 0xC2B2AE35) & M32
    return x ^ (x >> 16)


def oracle_uniform(seed: int, position: int, purpose: int) -> float:
    """The documented hash with Python integers (independent of the torch and Triton code)."""
    s, p = seed & (2**64 - 1), position & (2**64 - 1)
    h = _fmix(0x243F6A88 ^ purpose)
    for word in (s & M32, s >> 32, p >> 32, p & M32):
        h = _fmix(h ^ word)
    h = _fmix(h ^ 0x9E3779B9)
    return (h >> 8) / 2**24


def chi2_upper(df: int, z: float = 4.75) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df); z = 4.75 is a 1e-6 upper tail."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def test_uniform_matches_python_transcription():
    """Design: "The RNG split by seed, logical position and purpose" -- one fixed hash, any
    device."""
    gen = np.random.default_rng(1)
    seeds = [0, 1, -1, 2**63 - 1, -2**63] + [int(x) for x in gen.integers(-2**63, 2**63 - 1, 60)]
    positions = [0, 1, 2**31, 2**40 + 3] + [int(x) for x in gen.integers(0, 2**62, 61)]
    for purpose in rng.Purpose:
        got = rng.uniform(torch.tensor(seeds), torch.tensor(positions), purpose)
        want = [oracle_uniform(s, p, purpose) for s, p in zip(seeds, positions)]
        assert got.dtype == torch.float32
        assert got.tolist() == want  # multiples of 2**-24: exact in float32


def test_purposes_and_positions_give_independent_streams():
    """Design: the stream is keyed by (seed, position, purpose); streams must not coincide."""
    pos = torch.arange(4096)
    seed = torch.full_like(pos, 7)
    streams = [rng.uniform(seed, pos, p) for p in rng.Purpose]
    for i in range(len(streams)):
        for j in range(i + 1, len(streams)):
            corr = np.corrcoef(streams[i].numpy(), streams[j].numpy())[0, 1]
            assert abs(corr) < 0.08  # 5 sigma for 4096 independent pairs
            assert (streams[i] == streams[j]).float().mean() < 0.01


def test_uniform_is_uniform_over_positions_and_seeds():
    """Sampling relies on u ~ U[0, 1): chi-square over 64 equal bins, 1e-6 false-alarm bound."""
    n = 200_000
    pos = torch.arange(n) % 5000
    seed = torch.arange(n) // 5000 - 20
    u = rng.uniform(seed, pos, rng.Purpose.SAMPLE)
    assert float(u.min()) >= 0.0 and float(u.max()) < 1.0
    counts = torch.bincount((u * 64).long(), minlength=64).double()
    chi2 = float(((counts - n / 64) ** 2 / (n / 64)).sum())
    assert chi2 < chi2_upper(63)
    lag = np.corrcoef(u[:-1].numpy(), u[1:].numpy())[0, 1]  # neighbouring positions
    assert abs(lag) < 0.015


def test_purpose_key_rejects_out_of_range():
    """A purpose is one 32-bit word of the key."""
    with pytest.raises(ValueError, match="purpose"):
        rng.purpose_key(2**32)
