"""The gated delta rule and causal conv kernels against their torch references, and the references
against independent forms: the chunked algebra against the token-by-token loop in float64, the loop
against transformers' `torch_recurrent_gated_delta_rule`.

Backends: `reference` in process; `interpreter` (kernels/gdn.py and kernels/conv.py under
TRITON_INTERPRET=1, small shapes) in a child pytest, because TRITON_INTERPRET must be set before
triton is first imported (see tests/kernels/test_kernels_sampling.py); `cuda` marked gpu.
Design (STYLE.md 5): "a plain-torch reference beside every kernel".
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from kernels import gdn_ref
from tests.support.kernel_backends import run_interpreted

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()


def inputs(B, T, hk, hv, dk, dv, *, seed=0, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1) * dk**-0.5
    k = F.normalize(torch.randn(B, T, hk, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, hv, dv, generator=g, dtype=torch.float64)
    gate = -torch.rand(B, T, hv, generator=g, dtype=torch.float64) * 2
    beta = torch.rand(B, T, hv, generator=g, dtype=torch.float64)
    s = torch.randn(B, hv, dk, dv, generator=g, dtype=torch.float64)

    def cast(x):
        return x.to(device=device, dtype=dtype)

    return (
        cast(q),
        cast(k),
        cast(v),
        gate.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype),
        beta.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype),
        s.to(device=device, dtype=torch.float32 if dtype != torch.float64 else dtype),
    )


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
    o2, s2 = torch_recurrent_gated_delta_rule(
        q * 16**0.5, k, v, g, beta, initial_state=s, output_final_state=True
    )
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
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=gen)).to(device=device, dtype=dtype)

    y = rnd(B, T, 2 * hk * dk + hv * dv)  # conv output [q | k | v]
    ab = rnd(B, T, 2 * hv + 3, scale=2.0)  # a and b as column slices of a wider projection
    a, b = ab[..., 1:1 + hv], ab[..., 1 + hv:1 + 2 * hv]
    A_log, dt_bias = rnd(hv, scale=0.5), rnd(hv, scale=0.5)
    state = torch.randn(8, hv, dk, dv, generator=gen).to(device)
    idx = dict(
        src=torch.tensor([1, 3, 5], device=device),
        dst=torch.tensor([2, 3, 6], device=device),
        reset=torch.tensor([0, 0, 1], dtype=torch.int32, device=device),
        counts=torch.tensor([5, 2, 3], device=device),
    )
    skip = torch.tensor([0, 1, 0], dtype=torch.int32, device=device)
    x, windows, weight = (
        rnd(B, T, C + 5)[..., 2 : 2 + C],
        rnd(8, C, 3),
        rnd(C, 4),
    )  # x: a column slice
    return (y, a, b, A_log, dt_bias, state, idx, skip, dict(num_k_heads=hk, key_dim=dk)), (
        x,
        windows,
        weight,
    )


def _check_kernels(device: str, dtype: torch.dtype, tol: float, **shape) -> None:
    """gdn_step and causal_conv1d against their references: every row's state (including skipped
    and reset rows, and rows whose padding must not count), outputs of live rows, conv outputs and
    windows."""
    from kernels.conv import causal_conv1d
    from kernels.gdn import gdn_step

    (y, a, b, A_log, dt_bias, state, idx, skip, heads), (x, windows, weight) = _indexed_case(
        device, dtype, **shape
    )
    for use_skip in (None, skip):
        for want_out in (True, False):
            s1, s2 = state.clone(), state.clone()
            o1 = gdn_ref.gdn_step_ref(
                y, a, b, A_log, dt_bias, s1, **idx, skip=use_skip, want_out=want_out, **heads
            )
            o2 = gdn_step(
                y,
                a,
                b,
                A_log,
                dt_bias,
                s2,
                **idx,
                skip=use_skip,
                want_out=want_out,
                block_v=8,
                **heads,
            )
            assert (s1 - s2).abs().max().item() <= tol * max(1.0, s1.abs().max().item()), (
                use_skip,
                want_out,
            )
            if want_out:
                live = [0, 2] if use_skip is not None else [0, 1, 2]
                err = (o1[live].float() - o2[live].float()).abs().max().item()
                assert err <= tol * max(1.0, o1.float().abs().max().item()), (use_skip, err)
            else:
                assert o1 is None and o2 is None
    _check_commit_kernels(
        device, dtype, tol, y, a, b, A_log, dt_bias, state, idx, heads, x, windows
    )
    _check_gated_norm(device, dtype, tol)
    w1, w2 = windows.clone(), windows.clone()
    c1 = gdn_ref.causal_conv1d_indexed_ref(
        x, w1, weight, idx["src"], idx["dst"], idx["reset"], idx["counts"]
    )
    c2 = causal_conv1d(
        x, w2, weight, idx["src"], idx["dst"], idx["reset"], idx["counts"], block_c=16
    )
    assert (c1.float() - c2.float()).abs().max().item() <= tol * max(
        1.0, c1.float().abs().max().item()
    )
    assert (w1.float() - w2.float()).abs().max().item() == 0.0  # windows are copies of inputs


def _check_commit_kernels(
    device, dtype, tol, y, a, b, A_log, dt_bias, state, idx, heads, x, windows
) -> None:
    """gdn_replay and commit_windows (all layers in one launch, recorded inputs read in place by
    row) against their references, on G = 2 layers built from the single-layer case."""
    from kernels.conv import commit_windows
    from kernels.gdn import gdn_replay

    G = 2
    ry = torch.stack([y, y.flip(0)]).contiguous()  # [G, R=B, W=T, C]
    ra, rb = torch.stack([a, a.flip(0)]).contiguous(), torch.stack([b, -b]).contiguous()
    A, dt = (
        torch.stack([A_log, -A_log]).float(),
        torch.stack([dt_bias, dt_bias * 2]).float(),
    )  # [G, Hv]
    ssm = torch.stack([state, state.flip(0)]).contiguous()  # [G, N, Hv, dk, dv]
    rows = torch.tensor([2, 0, 1], device=device)
    src = idx["src"]
    dst = torch.tensor([2, 4, 6], device=device)  # != src, as in a commit
    kept = torch.tensor([3, 1, 5], device=device)
    skip = torch.tensor([0, 0, 1], dtype=torch.int32, device=device)
    s1, s2 = ssm.clone(), ssm.clone()
    gdn_ref.gdn_replay_ref(ry, ra, rb, rows, A, dt, s1, src, dst, idx["reset"], kept, skip, **heads)
    gdn_replay(ry, ra, rb, rows, A, dt, s2, src, dst, idx["reset"], kept, skip, block_v=8, **heads)
    assert (s1 - s2).abs().max().item() <= tol * max(1.0, s1.abs().max().item())
    rx = torch.stack([x, x * 2]).contiguous()  # [G, R, W, C]
    wins = torch.stack([windows, windows.flip(0)]).contiguous()  # [G, N, C, K-1]
    w1, w2 = wins.clone(), wins.clone()
    gdn_ref.commit_windows_ref(w1, rx, rows, src, dst, idx["reset"], kept, skip)
    commit_windows(w2, rx, rows, src, dst, idx["reset"], kept, skip, block_c=16)
    assert torch.equal(w1, w2)
    assert G == ssm.shape[0]


def _check_gated_norm(device, dtype, tol) -> None:
    """kernels/gdn_norm.py against GatedRMSNorm's torch path, z a column slice."""
    from kernels.gdn_norm import gated_rmsnorm
    from services.worker.models.gdn import GatedRMSNorm

    gen = torch.Generator().manual_seed(5)
    B, T, hv, dv = 2, 3, 4, 24
    o = torch.randn(B, T, hv, dv, generator=gen).to(device=device, dtype=dtype)
    zz = torch.randn(B, T, hv * dv + 7, generator=gen).to(device=device, dtype=dtype)
    z = zz[..., 3:3 + hv * dv]
    norm = GatedRMSNorm(dv, 1e-6, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.3 * torch.randn(dv, generator=gen))
    ref = norm.to("cpu")(o.cpu(), z.cpu())  # the torch path
    ours = gated_rmsnorm(
        o.reshape(B * T, hv, dv), z.reshape(B * T, hv * dv), norm.weight.to(device), 1e-6
    )
    assert (
        ours.reshape(B, T, hv, dv).float().cpu() - ref.float()
    ).abs().max().item() <= tol * ref.abs().max().item() + 1e-6


@pytest.mark.skipif(INTERPRETED, reason="reference checks run in the parent process")
def test_commit_windows_reference():
    """commit_windows_ref against the definition: the window after n inputs is the last K-1 of
    [window before; first n inputs]."""
    gen = torch.Generator().manual_seed(9)
    windows = torch.randn(1, 4, 5, 3, generator=gen)
    x = torch.randn(1, 2, 6, 5, generator=gen)
    rows, src, dst = torch.tensor([1, 0]), torch.tensor([0, 2]), torch.tensor([1, 3])
    reset, kept, skip = (
        torch.tensor([0, 1], dtype=torch.int32),
        torch.tensor([2, 5]),
        torch.zeros(2, dtype=torch.int32),
    )
    out = windows.clone()
    gdn_ref.commit_windows_ref(out, x, rows, src, dst, reset, kept, skip)
    for b in range(2):
        before = torch.zeros(5, 3) if reset[b] else windows[0, src[b]]
        stream = torch.cat([before, x[0, rows[b], :kept[b]].T], dim=1)
        assert torch.equal(out[0, dst[b]], stream[:, -3:])


@pytest.mark.skipif(INTERPRETED, reason="reference checks run in the parent process")
def test_step_reference_counts_and_skip():
    """gdn_step_ref's bookkeeping against direct use of the recurrence: padding past counts[b]
    leaves the state as after counts[b] tokens, skip rows keep their destination, reset rows start
    from zeros."""
    (y, a, b, A_log, dt_bias, state, idx, skip, heads), _ = _indexed_case("cpu", torch.float64)
    out = state.clone()
    gdn_ref.gdn_step_ref(y, a, b, A_log, dt_bias, out, **idx, skip=skip, **heads)
    for r, (src, dst, reset, n) in enumerate(
        zip(idx["src"], idx["dst"], idx["reset"], idx["counts"])
    ):
        if skip[r]:
            assert torch.equal(out[dst], state[dst])
            continue
        q, k, v, g, beta = gdn_ref.gdn_inputs(
            y[r : r + 1, :n], a[r : r + 1, :n], b[r : r + 1, :n], A_log, dt_bias, n[None], **heads
        )
        s0 = torch.zeros_like(state[src]) if reset else state[src]
        _, expected = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s0[None])
        assert (out[dst] - expected[0]).abs().max() < 1e-6  # the state is float32


@pytest.mark.skipif(not INTERPRETED, reason="runs in the interpreter child process")
def test_kernels_interpreter():
    _check_kernels("cpu", torch.float32, 1e-5)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_triton_kernels_under_interpreter():
    """Triton's interpreter runs the GDN recurrence and the conv kernel on small shapes against the
    torch references (a child pytest with TRITON_INTERPRET=1)."""
    run_interpreted(__file__, timeout=600)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_kernels_cuda(dtype, tol):
    _check_kernels("cuda", dtype, tol)
    _check_kernels("cuda", dtype, tol, B=3, T=16, hk=16, hv=32, dk=128, dv=128, C=8192)


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_chunk_prefill_cuda_float32_is_float32_accurate():
    """Float32 prefill must be float32-accurate: fla-core's chunked kernel runs its dots in TF32
    (about 1e-3 relative here, which moved the tiny Qwen3.5 model's logits on an H200 by 6e-3 of
    their scale), so gdn_chunk takes the torch chunked form for float32. At the tiny test model's
    GDN shape (Hk=2, Hv=4, dk=16, dv=8), 40 tokens, row 1 right-padded after 5 tokens."""
    q, k, v, g, beta, s = inputs(2, 40, 2, 4, 16, 8, seed=40, dtype=torch.float64)
    g[1, 5:], beta[1, 5:] = 0, 0
    o1, s1 = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    from kernels.gdn import gdn_chunk

    o2, s2 = gdn_chunk(*(x.to("cuda", torch.float32) for x in (q, k, v, g, beta, s)))
    assert o2.dtype == torch.float32 and s2.dtype == torch.float32
    assert (o1 - o2.double().cpu()).abs().max().item() <= 1e-5 * o1.abs().max().item()
    assert (s1 - s2.double().cpu()).abs().max().item() <= 1e-5 * s1.abs().max().item()


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("T", [33, 200, 1000])
def test_chunk_prefill_cuda(T):
    """gdn_chunk (fla-core's chunked kernel when installed, else the torch chunked form) against
    the token loop at the 9B head shape, bf16 inputs and float32 state."""
    from kernels.gdn import _fla_chunk, gdn_chunk

    print("fla-core chunk kernel:", _fla_chunk() is not None)
    q, k, v, g, beta, s = inputs(
        2, T, 16, 32, 128, 128, seed=T, dtype=torch.bfloat16, device="cuda"
    )
    o1, s1 = gdn_ref.gated_delta_rule_ref(q, k, v, g, beta, s)
    o2, s2 = gdn_chunk(q, k, v, g, beta, s)
    scale_o, scale_s = o1.float().abs().max().item(), s1.abs().max().item()
    assert (o1.float() - o2.float()).abs().max().item() <= 3e-2 * scale_o
    assert (s1 - s2).abs().max().item() <= 3e-2 * scale_s
