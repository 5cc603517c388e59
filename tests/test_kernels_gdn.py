"""The gated delta rule and causal conv kernels against their torch references, and the references
against independent forms: the chunked algebra against the token-by-token loop in float64, the loop
against transformers' `torch_recurrent_gated_delta_rule`.

Backends: `reference` in process; `interpreter` (kernels/gdn.py and kernels/conv.py under
TRITON_INTERPRET=1, small shapes) in a child pytest, because TRITON_INTERPRET must be set before
triton is first imported (see tests/test_kernels_sampling.py); `cuda` marked gpu.
Design (STYLE.md 5): "a plain-torch reference beside every kernel".
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kernels import gdn_ref

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()


def inputs(B, T, hk, hv, dk, dv, *, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1) * dk ** -0.5
    k = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, hv, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, T, hv, generator=g, dtype=torch.float64) * 2
    beta = torch.rand(B, T, hv, generator=g, dtype=torch.float64)
    s = torch.randn(B, hv, dk, dv, generator=g, dtype=torch.float64)
    cast = (lambda x: x.to(device=device, dtype=dtype))
    return cast(q), cast(k), cast(v), gate.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype), \
        beta.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype), \
        s.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype)


@pytest.mark.skipif(INTERPRETED, reason="reference checks run in the parent process")
@pytest.mark.parametrize("T,chunk", [(1, 4), (7, 4), (16, 8), (37, 8)])
def test_chunked_form_equals_recurrence(T, chunk):
    q, k, v, g, beta, s = inputs(2, T, 2, 4, 8, 6, seed=T, dtype=torch.float64)
    o1, s1 = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    o2, s2 = gdn_ref.chunk_gated_delta_rule_ref(q, k, v, g, beta, s, chunk=chunk)
    assert (o1 - o2).abs().max() < 1e-12 and (s1 - s2).abs().max() < 1e-12


@pytest.mark.skipif(INTERPRETED, reason="reference checks run in the parent process")
def test_recurrence_matches_transformers():
    from transformers.models.qwen3_5.modeling_qwen3_5 import torch_recurrent_gated_delta_rule

    q, k, v, g, beta, s = inputs(2, 9, 2, 4, 16, 8, seed=3)
    o1, s1 = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    # transformers normalises inside and scales q itself
    o2, s2 = torch_recurrent_gated_delta_rule(q * 16 ** 0.5, k, v, g, beta, initial_state=s, output_final_state=True)
    assert (o1 - o2).abs().max() < 1e-5 and (s1 - s2).abs().max() < 1e-5


@pytest.mark.skipif(INTERPRETED, reason="reference checks run in the parent process")
def test_padding_tokens_leave_state_unchanged():
    """g = beta = 0 is an exact identity on the state (how padded rows keep their state)."""
    q, k, v, g, beta, s = inputs(1, 6, 2, 4, 8, 8, seed=4)
    _, s_real = gdn_ref.gated_delta_rule_ref(q[:, :3], k[:, :3], v[:, :3], g[:, :3], beta[:, :3], s)
    g[:, 3:], beta[:, 3:] = 0, 0
    _, s_pad = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    assert torch.equal(s_real, s_pad)


def _indexed_case(device, dtype, B=3, T=5, hk=2, hv=4, dk=16, dv=12, C=40, seed=0):
    q, k, v, g, beta, _ = inputs(B, T, hk, hv, dk, dv, seed=seed, dtype=dtype, device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    state = torch.randn(8, hv, dk, dv, generator=gen).to(device)
    idx = dict(src=torch.tensor([1, 3, 5], device=device), dst=torch.tensor([2, 3, 6], device=device),
               reset=torch.tensor([0, 0, 1], dtype=torch.int32, device=device))
    skip = torch.tensor([0, 1, 0], dtype=torch.int32, device=device)
    x = torch.randn(B, T, C, generator=gen).to(device=device, dtype=dtype)
    windows = torch.randn(8, C, 3, generator=gen).to(device=device, dtype=dtype)
    weight = torch.randn(C, 4, generator=gen).to(device=device, dtype=dtype)
    counts = torch.tensor([5, 2, 3], device=device)
    return (q, k, v, g, beta, state, idx, skip), (x, windows, weight, counts)


def _check_kernels(device: str, dtype: torch.dtype, tol: float, **shape) -> None:
    from kernels.conv import causal_conv1d
    from kernels.gdn import gdn_recurrent

    (q, k, v, g, beta, state, idx, skip), (x, windows, weight, counts) = _indexed_case(device, dtype, **shape)
    for use_skip in (None, skip):
        for with_q in (True, False):
            a, b = state.clone(), state.clone()
            o1 = gdn_ref.gdn_recurrent_ref(q if with_q else None, k, v, g, beta, a, **idx, skip=use_skip)
            o2 = gdn_recurrent(q if with_q else None, k, v, g, beta, b, **idx, skip=use_skip, block_v=8)
            assert (a - b).abs().max().item() <= tol, (use_skip, with_q)
            if with_q:
                live = [0, 2] if use_skip is not None else [0, 1, 2]
                assert (o1[live].float() - o2[live].float()).abs().max().item() <= tol
            else:
                assert o1 is None and o2 is None
    a, b = windows.clone(), windows.clone()
    y1 = gdn_ref.causal_conv1d_indexed_ref(x, a, weight, idx["src"], idx["dst"], idx["reset"], counts)
    y2 = causal_conv1d(x, b, weight, idx["src"], idx["dst"], idx["reset"], counts, block_c=16)
    assert (y1.float() - y2.float()).abs().max().item() <= tol * max(1.0, y1.abs().max().item())
    assert (a.float() - b.float()).abs().max().item() == 0.0  # windows are copies of inputs


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter child process")
def test_kernels_interpreter():
    _check_kernels("cpu", torch.float32, 1e-5)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_triton_kernels_under_interpreter():
    """Triton's interpreter runs the GDN recurrence and the conv kernel on small shapes against the
    torch references (a child pytest with TRITON_INTERPRET=1)."""
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", str(Path(__file__)), "-q", "-x", "-k",
                           "interpreter and not under_interpreter", "-p", "no:cacheprovider"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_kernels_cuda(dtype, tol):
    _check_kernels("cuda", dtype, tol)
    _check_kernels("cuda", dtype, tol, B=3, T=16, hk=16, hv=32, dk=128, dv=128, C=8192)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("T", [33, 200, 1000])
def test_chunk_prefill_cuda(T):
    """gdn_chunk (fla-core's chunked kernel when installed, else the torch chunked form) against
    the token loop at the 9B head shape, bf16 inputs and float32 state."""
    from kernels.gdn import _fla_chunk, gdn_chunk

    print("fla-core chunk kernel:", _fla_chunk() is not None)
    q, k, v, g, beta, s = inputs(2, T, 16, 32, 128, 128, seed=T, dtype=torch.bfloat16, device="cuda")
    o1, s1 = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    o2, s2 = gdn_chunk(q, k, v, g, beta, s)
    scale_o, scale_s = o1.float().abs().max().item(), s1.abs().max().item()
    assert (o1.float() - o2.float()).abs().max().item() <= 3e-2 * scale_o
    assert (s1 - s2).abs().max().item() <= 3e-2 * scale_s
