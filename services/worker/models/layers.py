"""The non-attention ops of a decoder layer, one home for the dense and the Qwen3.5 models:
RMSNorm (plain, fused with the residual add, zero-centred), RoPE on q and k, SwiGLU on a fused
gate|up output.

On CUDA each op is one Triton kernel (float32 / float16 / bfloat16) (kernels/norms.py, rope.py,
swiglu.py); elsewhere it is the cheapest torch form that keeps the kernels' rounding rule
(kernels/*_ref.py state it). The rounding steps are the models' own: h = x + residual rounded once
to the dtype; the Llama convention rounds x / rms(x) to the dtype before the weight product, the
zero-centred one rounds the float32 product once.

A model takes the fused path when its `fused` attribute is True (set by `fuse_projections()` at
load time); `fused = False` selects the original op-by-op code on the same weights, which the
benchmarks use as the "before" of one run.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kernels import cpu_gemv
from kernels.cpu_gemv import QuantizedMatrix
from kernels.norms_ref import rms_norm_ref
from kernels.rope_ref import rope_ref
from kernels.swiglu_ref import swiglu_ref
from services.settings import switch

# The projections computed by one GEMM once fused (models/fused_linear.py), in output order.
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj")
MLP_PROJECTIONS = ("gate_proj", "up_proj")  # swiglu reads gate first, then up


_KERNEL_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# The weight GEMMs of the fused path through kernels/gemv.py's Triton GEMV for decode rows
# (<= 16 rows, bf16 / fp16, CUDA, the shapes where a measured config beat cuBLAS: gemv.TUNED);
# F.linear (cuBLAS) otherwise, and everywhere with INFERNIX_GEMV=0.
GEMV = switch("gemv")

# Width invariance (INFERNIX_WIDTH_INVARIANT=1): on CUDA every forward of up to
# INVARIANT_MAX_WIDTH tokens a row computes each row with the same bits as a decode step of that
# row would, whatever the forward's width (a verify forward's K+1 tokens) and batch: every weight
# GEMM of up to gemv.INVARIANT_MAX_ROWS rows through the GEMV with one config per weight shape
# (gemv_configs.invariant_config), the norms with a row block chosen by the row length only,
# attention per query with context splits fixed by the lane length (models/kv_cache.py). What
# makes greedy speculative decoding in bf16 token-identical to plain greedy decoding.
WIDTH_INVARIANT = switch("width_invariant")
# Wider forwards (prefill chunks, whose rows no decode step recomputes) keep the faster route:
# the tokens up to which a hybrid model takes the per-token recurrence (program/buckets.py).
INVARIANT_MAX_WIDTH = 32


def width_invariant(tokens: int) -> bool:
    """Whether a forward of `tokens` tokens a row takes the width-invariant route."""
    return WIDTH_INVARIANT and tokens <= INVARIANT_MAX_WIDTH


# On the CPU, decode rows (<= cpu_gemv.MAX_ROWS) of a GEMM whose weight the GGUF stores in a block
# format read those blocks (kernels/cpu_gemv.py: the same float32 weights, a fifth of the bytes);
# F.linear on the float32 matrix otherwise, and everywhere with INFERNIX_CPU_GEMV=0.
CPU_GEMV = switch("cpu_gemv")


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           quantized: QuantizedMatrix | None = None) -> torch.Tensor:
    """x @ weight^T (+ bias) of the fused path's weight GEMMs (see GEMV, CPU_GEMV); `quantized`:
    `weight` as the checkpoint stores it, when in a block format."""
    if x.is_cuda:
        invariant = width_invariant(x.shape[-2] if x.dim() >= 3 else 1)  # x: [B, T, K]
        if GEMV or invariant:
            from kernels.gemv import linear as gemv_linear

            return gemv_linear(x, weight, bias, invariant=invariant)
        return F.linear(x, weight, bias)
    if (quantized is not None and CPU_GEMV and x.dtype == torch.float32 and x.device.type == "cpu"
            and x.numel() <= cpu_gemv.MAX_ROWS * x.shape[-1] and cpu_gemv.available()):
        return quantized.linear(x, bias)
    return F.linear(x, weight, bias)


def uses_kernels(x: torch.Tensor) -> bool:
    """Whether the Triton kernels take x: a CUDA tensor of a dtype they read (float64 runs the
    torch forms, e.g. the float64 test models on CUDA)."""
    return x.is_cuda and x.dtype in _KERNEL_DTYPES


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             zero_centered: bool = False) -> torch.Tensor:
    """RMSNorm over the last dimension of x [..., D] (a strided head view is fine); returns a
    tensor of x's shape and dtype."""
    if uses_kernels(x):
        from kernels.norms import rms_norm as kernel

        return kernel(x, weight, eps, zero_centered=zero_centered, invariant=WIDTH_INVARIANT)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        # one fused torch op; in float32 both conventions are the same product
        w = weight + 1.0 if zero_centered else weight
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return rms_norm_ref(x, weight, eps, zero_centered=zero_centered)


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
                 zero_centered: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(h), h) with h = x + residual rounded to x's dtype, in one kernel on CUDA."""
    if uses_kernels(x):
        from kernels.norms import add_rms_norm as kernel

        return kernel(x, residual, weight, eps, zero_centered=zero_centered,
                      invariant=WIDTH_INVARIANT)
    h = x + residual
    return rms_norm(h, weight, eps, zero_centered=zero_centered), h


def rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
         sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [B, T, H, D] and k [B, T, Hkv, D] rotated on their first R dims by cos, sin [B, T, R/2]
    (float32). On CUDA in place (q and k may be views of a fused projection output, which they
    then overwrite); elsewhere new tensors. Returns (q, k)."""
    if uses_kernels(q):
        from kernels.rope import apply_rope_

        apply_rope_(q, k, cos, sin)
        return q, k
    if q.dtype == torch.float32 and k.dtype == torch.float32 and cos.dtype == torch.float32:
        # rope_ref's products and sums, once over q and k's heads together and without its
        # dtype round trips (no-ops in float32): the same values in a third of the ops
        heads = q.shape[-2]
        x = torch.cat([q, k], dim=-2)  # [B, T, H + Hkv, D]
        half = cos.shape[-1]
        x1, x2 = x[..., :half], x[..., half:2 * half]
        c, s = cos[..., None, :], sin[..., None, :]
        out = torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, x[..., 2 * half:]], dim=-1)
        return out[..., :heads, :], out[..., heads:, :]
    return rope_ref(q, cos, sin), rope_ref(k, cos, sin)


def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused gate|up output [..., 2I] -> [..., I]."""
    if uses_kernels(gate_up):
        from kernels.swiglu import swiglu as kernel

        return kernel(gate_up)
    return swiglu_ref(gate_up)
