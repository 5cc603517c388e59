"""kernels/cpu_gemv.py: the CPU GEMV on GGUF Q4_1 / Q8_0 blocks against gguf-py's dequantisation
and F.linear, and the fallback of models/layers.py `linear` when the kernel is missing."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kernels import cpu_gemv
from kernels.cpu_gemv import QuantizedMatrix
from services.worker.models import layers

needs_kernel = pytest.mark.skipif(not cpu_gemv.available(),
                                  reason=f"CPU GEMV unavailable: {cpu_gemv.unavailable_reason()}")
QTYPES = {"q4_1": gguf.GGMLQuantizationType.Q4_1, "q8_0": gguf.GGMLQuantizationType.Q8_0}


def blocks_of(kind: str, rows: int, cols: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw GGUF blocks [rows, bytes], gguf-py's float32 dequantisation [rows, cols]) of a random
    matrix quantised by gguf-py."""
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32)
    raw = gguf.quants.quantize(w, QTYPES[kind])
    return raw, gguf.quants.dequantize(raw, QTYPES[kind]).reshape(rows, cols).astype(np.float32)


@needs_kernel
@pytest.mark.parametrize("kind", cpu_gemv.KINDS)
def test_weights_equal_gguf_dequantisation_bit_for_bit(kind):
    """The kernel forms each weight exactly as the float32 checkpoint has it (gguf-py's
    dequantize: Q4_1 d * q + m rounded twice, Q8_0 d * q), so the GEMV changes summation order
    only; checked on every bit pattern of the dequantised matrix."""
    raw, expected = blocks_of(kind, 13, 96, seed=1)
    got = QuantizedMatrix.from_gguf_blocks(kind, raw, 13).dequantize().numpy()
    assert got.view(np.int32).tolist() == expected.view(np.int32).tolist()


@needs_kernel
@pytest.mark.parametrize("kind", cpu_gemv.KINDS)
@pytest.mark.parametrize("rows", [1, 3, 4, 6, 9])
def test_linear_matches_float64_product(kind, rows):
    """y = x @ W^T + bias for decode row counts on both sides of the kernel's 4-row passes and a
    matrix height that leaves a partial tile (N = 13), within float32 summation error of the
    float64 product on the dequantised weights."""
    raw, w = blocks_of(kind, 13, 128, seed=2)
    matrix = QuantizedMatrix.from_gguf_blocks(kind, raw, 13)
    x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(3))
    bias = torch.randn(13, generator=torch.Generator().manual_seed(4))
    expected = x.double() @ torch.from_numpy(w).double().T + bias.double()
    got = matrix.linear(x, bias)
    assert got.shape == (rows, 13) and got.dtype == torch.float32
    scale = (x.double().abs() @ torch.from_numpy(w).double().abs().T).max().item()
    assert (got.double() - expected).abs().max().item() <= 1e-5 * scale
    assert torch.equal(matrix.linear(x.view(1, rows, 128))[0], matrix.linear(x))  # leading dims


@needs_kernel
def test_row_selection_and_concatenation_follow_the_rows():
    """`rows` (the loader's Q/K row order) and `cat` (fused q|k|v) permute and stack weight rows
    exactly as the float32 matrices are permuted and stacked."""
    raw_a, w_a = blocks_of("q4_1", 8, 64, seed=5)
    raw_b, w_b = blocks_of("q4_1", 5, 64, seed=6)
    a = QuantizedMatrix.from_gguf_blocks("q4_1", raw_a, 8)
    b = QuantizedMatrix.from_gguf_blocks("q4_1", raw_b, 5)
    order = torch.tensor([3, 0, 7, 1, 2, 6, 4, 5])
    fused = QuantizedMatrix.cat([a.rows(order), b])
    expected = np.concatenate([w_a[order.numpy()], w_b])
    assert fused.dequantize().numpy().view(np.int32).tolist() == expected.view(np.int32).tolist()
    q8 = QuantizedMatrix.from_gguf_blocks("q8_0", blocks_of("q8_0", 2, 64, seed=7)[0], 2)
    assert QuantizedMatrix.cat([a, q8]) is None  # mixed formats stay separate GEMMs


@needs_kernel
def test_linear_refuses_wrong_input():
    """A typed error naming the expected input, never a wrong product."""
    matrix = QuantizedMatrix.from_gguf_blocks("q8_0", blocks_of("q8_0", 4, 64, seed=8)[0], 4)
    with pytest.raises(ValueError, match="float32"):
        matrix.linear(torch.zeros(1, 32))
    with pytest.raises(ValueError, match="float32"):
        matrix.linear(torch.zeros(1, 64, dtype=torch.float64))


def test_layers_linear_falls_back_to_float32_without_the_kernel(monkeypatch):
    """Without the kernel (no compiler, no AVX-512), and for more rows than decode takes it,
    models/layers.py `linear` is F.linear on the float32 weights, the path it replaces."""
    raw, w = blocks_of("q4_1", 6, 64, seed=9)
    matrix = QuantizedMatrix.from_gguf_blocks("q4_1", raw, 6)
    weight = torch.from_numpy(w)
    x = torch.randn(2, 64, generator=torch.Generator().manual_seed(10))
    monkeypatch.setattr(cpu_gemv, "available", lambda: False)
    assert torch.equal(layers.linear(x, weight, None, matrix), F.linear(x, weight))
    monkeypatch.undo()
    many = torch.randn(cpu_gemv.MAX_ROWS + 1, 64, generator=torch.Generator().manual_seed(11))
    assert torch.equal(layers.linear(many, weight, None, matrix), F.linear(many, weight))
