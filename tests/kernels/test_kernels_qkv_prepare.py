"""The fused q/k norm + RoPE + KV write (kernels/qkv_prepare.py) against the sequence of references
it replaces, on views of a fused q|k|v projection output."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.qkv_prepare import prepare_qkv_ref
from tests.kernels.test_kernels_layers import UNIT, close
from tests.support.kernel_backends import INTERPRETED, backend_params, run_interpreted

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


def _case(gen, dev, dtype, b, t, h, hk, d, rot, norms):
    qkv = torch.from_numpy(gen.normal(0, 2, (b, t, (h + 2 * hk) * d))).to(dtype).to(dev)
    q = qkv[..., :h * d].view(b, t, h, d)
    k = qkv[..., h * d:(h + hk) * d].view(b, t, hk, d)
    v = qkv[..., (h + hk) * d:].view(b, t, hk, d)
    ang = torch.from_numpy(gen.uniform(0, 300, (b, t, rot // 2))).float().to(dev)
    cos, sin = ang.cos(), ang.sin()
    w = (torch.from_numpy(gen.normal(0, 0.5, (2, d))).to(dtype).to(dev) if norms else None)
    nb, bs = 3 * b * t, 4
    table = torch.from_numpy(gen.permutation(nb)[:b * (nb // b)].reshape(b, -1)).to(torch.int32)
    positions = torch.stack([torch.arange(5, 5 + t) for _ in range(b)])
    positions[-1, -1] = -1  # padding: q rotated, nothing written
    kc = torch.zeros(nb, bs, hk, d, dtype=dtype, device=dev)
    return qkv, q, k, v, cos, sin, w, kc, table.to(dev), positions.to(dev)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("variant", ["qwen3", "qwen35-partial", "llama-no-norm"])
def test_prepare_qkv_equals_the_reference_sequence(backend, dtype, variant):
    """Qwen3: q = rope(q_norm(q)), k = rope(k_norm(k)) (services/worker/models/dense.py), K/V into
    their blocks; Qwen3.5: zero-centred norms and 64 of 256 dims rotated (scaled down here to 8 of
    32); Llama: no norms. The result equals the references applied in sequence, to one or two
    rounding steps."""
    gen = np.random.default_rng(1)
    norms, zero, rot = {"qwen3": (True, False, 32), "qwen35-partial": (True, True, 8),
                        "llama-no-norm": (False, False, 32)}[variant]
    qkv, q, k, v, cos, sin, w, kc, table, pos = _case(gen, backend[1], dtype, 2, 3, 4, 2, 32,
                                                      rot, norms)
    vc = torch.zeros_like(kc)
    ref = [x.cpu().clone() for x in (qkv, kc, vc)]
    rq = ref[0][..., :4 * 32].view(2, 3, 4, 32)
    rk, rv = (ref[0][..., s:e].view(2, 3, 2, 32) for s, e in ((128, 192), (192, 256)))
    kw = dict(q_norm=None if w is None else w[0], k_norm=None if w is None else w[1], eps=1e-6,
              zero_centered=zero)
    prepare_qkv_ref(rq, rk, rv, cos.cpu(), sin.cpu(), ref[1], ref[2], table.cpu(), pos.cpu(),
                    **{a: (b.cpu() if isinstance(b, torch.Tensor) else b) for a, b in kw.items()})
    if backend[0] == "reference":
        prepare_qkv_ref(q, k, v, cos, sin, kc, vc, table, pos, **kw)
    else:
        from kernels.qkv_prepare import prepare_qkv
        prepare_qkv(q, k, v, cos, sin, kc, vc, table, pos, **kw)
    for got, want in zip((qkv, kc, vc), ref):  # scale 1: the rotation's terms are O(1) here
        close(got, want.double().numpy(), dtype, ulps=2.01, scale=1.0)
    assert torch.equal(qkv[..., 128:].cpu(), ref[0][..., 128:])  # k and v are read only
    assert torch.equal(vc.cpu(), ref[2])  # v is copied bit for bit
    written = (kc != 0).any(-1).any(-1).sum()
    assert int(written) == 2 * 3 - 1  # every real token's slot, not the padding's


def test_prepare_qkv_rejects_bad_inputs():
    from kernels.qkv_prepare import prepare_qkv
    gen = np.random.default_rng(2)
    qkv, q, k, v, cos, sin, w, kc, table, pos = _case(gen, "cpu", torch.float32, 1, 2, 2, 1, 16,
                                                      16, True)
    with pytest.raises(ValueError, match="q_norm"):
        prepare_qkv(q, k, v, cos, sin, kc, kc.clone(), table, pos, q_norm=torch.ones(8))
    with pytest.raises(ValueError, match="cos, sin"):
        prepare_qkv(q, k, v, cos[..., :9].repeat(1, 1, 2), sin, kc, kc.clone(), table, pos)


@pytest.mark.gpu
def test_prepare_qkv_at_qwen3_8b_shape_on_cuda():
    """B = 64 decode tokens, 32 q and 8 KV heads of 128, bf16, block 16."""
    from kernels.qkv_prepare import prepare_qkv
    gen = np.random.default_rng(3)
    qkv, q, k, v, cos, sin, w, kc, table, pos = _case(gen, "cuda", torch.bfloat16, 64, 1, 32, 8,
                                                      128, 128, True)
    vc = torch.zeros_like(kc)
    ref = [x.clone() for x in (qkv, kc, vc)]
    rq = ref[0][..., :4096].view(64, 1, 32, 128)
    rk = ref[0][..., 4096:5120].view(64, 1, 8, 128)
    rv = ref[0][..., 5120:].view(64, 1, 8, 128)
    prepare_qkv_ref(rq, rk, rv, cos, sin, ref[1], ref[2], table, pos, q_norm=w[0], k_norm=w[1])
    prepare_qkv(q, k, v, cos, sin, kc, vc, table, pos, q_norm=w[0], k_norm=w[1])
    for got, want in zip((qkv, kc, vc), ref):
        torch.testing.assert_close(got, want, rtol=2 * UNIT[torch.bfloat16], atol=1e-3)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_qkv_prepare_under_interpreter():
    """Every backend scenario above on the Triton kernel in a fresh interpreted process."""
    run_interpreted(__file__)
