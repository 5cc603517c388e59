"""RMSNorm, RoPE and SwiGLU kernels (Triton, interpreted and CUDA) and their torch references.

Each scenario runs per backend (tests/support/kernel_backends.py) against a float64 oracle written
from the checkpoints' formulas; the Triton backends are also compared with the torch reference,
within one rounding step of the dtype. Independent bases: float64 arithmetic, and the model code
that serves today (`services.worker.models.dense.RMSNorm`,
`services.worker.models.rope.apply_rope`).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from kernels.norms_ref import add_rms_norm_ref, rms_norm_ref
from kernels.rope_ref import apply_rope_ref_, rope_ref
from kernels.swiglu_ref import swiglu_ref
from tests.support.kernel_backends import INTERPRETED, backend_params, run_interpreted

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
UNIT = {torch.float32: 2.0 ** -21, torch.float16: 2.0 ** -10, torch.bfloat16: 2.0 ** -7}


@pytest.fixture(params=backend_params())
def backend(request):
    return request.param


def _ops(backend):
    name, _ = backend
    if name == "reference":
        return dict(rms_norm=lambda x, w, eps, z, out=None: _into(out, rms_norm_ref(
                        x, w, eps, zero_centered=z)),
                    add_rms_norm=lambda x, r, w, eps, z: add_rms_norm_ref(x, r, w, eps,
                                                                          zero_centered=z),
                    rope=apply_rope_ref_, swiglu=swiglu_ref)
    from kernels.norms import add_rms_norm, rms_norm
    from kernels.rope import apply_rope_
    from kernels.swiglu import swiglu
    return dict(rms_norm=lambda x, w, eps, z, out=None: rms_norm(x, w, eps, zero_centered=z,
                                                                 out=out),
                add_rms_norm=lambda x, r, w, eps, z: add_rms_norm(x, r, w, eps, zero_centered=z),
                rope=apply_rope_, swiglu=swiglu)


def _into(out, value):
    if out is None:
        return value
    out.copy_(value)
    return out


def close(got: torch.Tensor, want: np.ndarray, dtype: torch.dtype, ulps: float = 3.0,
          scale: np.ndarray | float = 0.0) -> None:
    """|got - want| <= ulps rounding units of dtype relative to |want| + scale (the magnitude of
    the terms that were summed, where they cancel), plus a tiny absolute."""
    g = got.detach().cpu().double().numpy()
    err = np.abs(g - want)
    bound = ulps * UNIT[dtype] * (np.abs(want) + scale + 1e-3 * (np.abs(want).max() + 1e-30))
    assert np.isfinite(g).all() and (err <= bound).all(), \
        f"max error {err.max():.3g}, worst ratio {(err / bound).max():.3g}"


def same_as_reference(backend, got: torch.Tensor, ref: torch.Tensor, dtype,
                      scale: np.ndarray | float = 0.0) -> None:
    """The Triton kernels follow the reference's rounding steps: within two units (a float32
    statistic one unit apart can flip each of the two roundings of the Llama convention).
    `scale`: the magnitude of terms that cancel (RoPE's x cos - y sin, which the GPU contracts
    into a fused multiply-add: one rounding of the terms instead of two)."""
    if backend[0] != "reference":
        close(got, ref.detach().cpu().double().numpy(), dtype, ulps=2.01, scale=scale)


def rand(gen, shape, dtype, device, scale=1.0):
    return torch.from_numpy(gen.normal(0, scale, shape)).to(dtype).to(device)


# ----------------------------------------------------------------------------- RMSNorm


def rms_oracle(x: np.ndarray, w: np.ndarray, eps: float, zero_centered: bool) -> np.ndarray:
    n = x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)
    return n * (1.0 + w) if zero_centered else n * w


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("zero_centered", [False, True], ids=["llama", "qwen35"])
def test_rms_norm_matches_float64(backend, dtype, zero_centered):
    """Llama/Qwen3: y = w * (x / rms(x)).to(dtype); Qwen3.5 (zero-centred RMSNorm):
    y = (x / rms(x) * (1 + w)).to(dtype); rms = sqrt(mean(x^2) + eps)."""
    gen = np.random.default_rng(1)
    ops = _ops(backend)
    for shape in [(3, 7, 96), (5, 4096), (1, 1, 40)]:  # odd row counts, D not a power of two
        x = rand(gen, shape, dtype, backend[1], 2.0)
        w = rand(gen, shape[-1:], dtype, backend[1], 0.5 if zero_centered else 1.0)
        y = ops["rms_norm"](x, w, 1e-6, zero_centered)
        assert y.shape == x.shape and y.dtype == dtype
        want = rms_oracle(x.cpu().double().numpy(), w.cpu().double().numpy(), 1e-6,
                          zero_centered)
        close(y, want, dtype)
        same_as_reference(backend, y, rms_norm_ref(x.cpu(), w.cpu(), 1e-6,
                                                   zero_centered=zero_centered), dtype)


def test_rms_norm_reference_is_the_serving_module():
    """The reference is the formula the dense model serves today
    (services/worker/models/dense.py)."""
    from services.worker.models.dense import RMSNorm
    gen = np.random.default_rng(2)
    for dtype in DTYPES:
        mod = RMSNorm(96, 1e-5, dtype=dtype)
        with torch.no_grad():
            mod.weight.copy_(rand(gen, (96,), dtype, "cpu"))
        x = rand(gen, (4, 96), dtype, "cpu", 3.0)
        assert torch.equal(rms_norm_ref(x, mod.weight, 1e-5), mod(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_add_rms_norm_returns_sum_and_norm(backend, dtype):
    """h = x + residual rounded once to the dtype (the model's `x = x + f(x)`), y = rms_norm(h)."""
    gen = np.random.default_rng(3)
    ops = _ops(backend)
    for zero_centered in (False, True):
        x, r = rand(gen, (6, 200), dtype, backend[1]), rand(gen, (6, 200), dtype, backend[1], 4.0)
        w = rand(gen, (200,), dtype, backend[1])
        y, h = ops["add_rms_norm"](x, r, w, 1e-5, zero_centered)
        assert torch.equal(h.cpu(), (x + r).cpu())  # one rounding of the exact sum: bit-exact
        want = rms_oracle(h.cpu().double().numpy(), w.cpu().double().numpy(), 1e-5, zero_centered)
        close(y, want, dtype)
        same_as_reference(backend, y, add_rms_norm_ref(x.cpu(), r.cpu(), w.cpu(), 1e-5,
                                                       zero_centered=zero_centered)[0], dtype)


def test_norms_in_place_on_head_views(backend):
    """A per-head q_norm runs on the q view of a fused q|k|v output in place (out=x), and the
    residual variant may write h over its residual input: nothing outside the view changes."""
    if backend[0] == "reference":
        pytest.skip("views and aliasing are a property of the kernel launch")
    from kernels.norms import add_rms_norm, rms_norm
    gen = np.random.default_rng(4)
    b, t, h, hk, d = 2, 3, 4, 2, 48
    qkv = rand(gen, (b, t, (h + 2 * hk) * d), torch.bfloat16, backend[1])
    before = qkv.clone()
    q = qkv[..., :h * d].view(b, t, h, d)  # strides (t*(h+2hk)*d, (h+2hk)*d, d, 1)
    w = rand(gen, (d,), torch.bfloat16, backend[1])
    want = rms_norm_ref(q.cpu(), w.cpu(), 1e-6)
    assert rms_norm(q, w, 1e-6, out=q) is q
    close(qkv[..., :h * d].view(b, t, h, d), want.double().numpy(), torch.bfloat16, 1.01)
    assert torch.equal(qkv[..., h * d:], before[..., h * d:])
    x, r = rand(gen, (5, 64), torch.float16, backend[1]), rand(gen, (5, 64), torch.float16,
                                                                backend[1])
    w16 = rand(gen, (64,), torch.float16, backend[1])
    want_y, want_h = add_rms_norm_ref(x.cpu(), r.cpu(), w16.cpu(), 1e-6)
    y, hh = add_rms_norm(x, r, w16, 1e-6, out=x, residual_out=r)
    assert y is x and hh is r and torch.equal(r.cpu(), want_h)
    close(x, want_y.double().numpy(), torch.float16, 1.01)


def test_invariant_norm_rows_do_not_depend_on_the_row_count(backend):
    """The width-invariant launch (models/layers.py WIDTH_INVARIANT): a head norm's row is the
    same bits whether the forward holds 1 token's heads or 4 tokens' (a verify forward), and
    within one rounding step of the reference."""
    if backend[0] == "reference":
        pytest.skip("a property of the kernel launch")
    from kernels.norms import add_rms_norm, rms_norm
    gen = np.random.default_rng(5)
    x = rand(gen, (1, 4, 8, 128), torch.bfloat16, backend[1])
    r = rand(gen, (1, 4, 8, 128), torch.bfloat16, backend[1])
    w = rand(gen, (128,), torch.bfloat16, backend[1])
    many = rms_norm(x, w, 1e-6, invariant=True)
    close(many, rms_norm_ref(x.cpu(), w.cpu(), 1e-6).double().numpy(), torch.bfloat16, 1.01)
    y_many, h_many = add_rms_norm(x, r, w, 1e-6, invariant=True)
    for t in range(4):
        assert torch.equal(rms_norm(x[:, t:t + 1], w, 1e-6, invariant=True), many[:, t:t + 1])
        y, h = add_rms_norm(x[:, t:t + 1], r[:, t:t + 1], w, 1e-6, invariant=True)
        assert torch.equal(y, y_many[:, t:t + 1]) and torch.equal(h, h_many[:, t:t + 1])
    one = rms_norm(x[0, 0, :1], w, 1e-6, invariant=True)  # a single row
    assert torch.equal(one, many[0, 0, :1])


def test_width_invariant_route_is_chosen_by_the_forward_width(monkeypatch):
    """Forwards of up to INVARIANT_MAX_WIDTH tokens a row (decode steps, verify forwards) take the
    width-invariant route when the switch is on; wider prefill chunks, and every forward with
    it off (its default), keep the fast one. The KV cache's attention follows the same rule and
    the row cap of the GEMV route."""
    from kernels.gemv import INVARIANT_MAX_ROWS
    from services.settings import default
    from services.worker.models import kv_cache, layers

    assert default("width_invariant") is False
    for on in (False, True):
        monkeypatch.setattr(layers, "WIDTH_INVARIANT", on)
        assert layers.width_invariant(1) == layers.width_invariant(
            layers.INVARIANT_MAX_WIDTH) == on
        assert not layers.width_invariant(layers.INVARIANT_MAX_WIDTH + 1)
        q = torch.empty(4, 5, 8, 16, device="meta")
        assert kv_cache._width_invariant(q) == on
        assert not kv_cache._width_invariant(torch.empty(INVARIANT_MAX_ROWS, 2, 8, 16,
                                                         device="meta"))
        assert not kv_cache._width_invariant(torch.empty(1, 64, 8, 16, device="meta"))
    x, w = torch.randn(2, 3, 16), torch.randn(8, 16)  # off CUDA: F.linear whatever the switch
    assert torch.equal(layers.linear(x, w), torch.nn.functional.linear(x, w))


def test_norms_reject_bad_inputs():
    """STYLE: errors name the argument and give expected and actual values."""
    from kernels.norms import add_rms_norm, rms_norm
    x = torch.zeros(2, 8)
    with pytest.raises(ValueError, match="weight"):
        rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm(x, torch.zeros(2, 8, dtype=torch.float16), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="x: expected float32"):
        rms_norm(x.long(), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="unit stride"):
        rms_norm(x.t(), torch.ones(2), 1e-6)


# ----------------------------------------------------------------------------- RoPE


def rope_oracle(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    # x: [N, H, D] float64; cos, sin: [N, R/2]; rotate_half pairs (i, i + R/2).
    # Returns the rotation and the magnitude of its two terms (for the rounding bound).
    half = cos.shape[-1]
    c, s = cos[:, None, :], sin[:, None, :]
    out, mag = x.copy(), np.zeros_like(x)
    x1, x2 = x[..., :half], x[..., half:2 * half]
    out[..., :half] = x1 * c - x2 * s
    out[..., half:2 * half] = x2 * c + x1 * s
    mag[..., :half] = mag[..., half:2 * half] = np.abs(x1 * c) + np.abs(x2 * s)
    return out, mag


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary", ["full", "partial"])
def test_rope_rotates_q_and_k_in_place(backend, dtype, rotary):
    """Hugging Face rotate_half: (x[i], x[i + R/2]) rotated by position * w[i]; partial rotary
    (Qwen3.5: 64 of 256 dims, `partial_rotary_factor` 0.25) leaves dims R..D-1 unchanged; YaRN
    frequencies and attention factor come in cos/sin (the rotation uses them as given). q, k are
    views of a fused q|k|v output."""
    from services.worker.models.config import RopeConfig
    from services.worker.models.rope import inverse_frequencies, rope_cos_sin
    gen = np.random.default_rng(5)
    b, t, h, hk, d = 2, 3, 4, 2, 32
    rot = d if rotary == "full" else d // 4
    rope = RopeConfig(rope_type="yarn", theta=1e6, factor=4.0,
                      original_max_position_embeddings=64)
    w, scaling = inverse_frequencies(rope, rot)
    positions = torch.from_numpy(gen.integers(0, 5000, (b, t)))
    cos, sin = rope_cos_sin(w, positions, scaling)  # [B, T, R/2] float32
    qkv = rand(gen, (b, t, (h + 2 * hk) * d), dtype, "cpu").to(backend[1])
    before = qkv.clone()
    q = qkv[..., :h * d].view(b, t, h, d)
    k = qkv[..., h * d:(h + hk) * d].view(b, t, hk, d)
    c64, s64 = (a.double().numpy().reshape(b * t, -1) for a in (cos, sin))  # as given
    want_q = rope_oracle(q.cpu().double().numpy().reshape(b * t, h, d), c64, s64)
    want_k = rope_oracle(k.cpu().double().numpy().reshape(b * t, hk, d), c64, s64)
    ref_q, ref_k = q.cpu().clone(), k.cpu().clone()
    apply_rope_ref_(ref_q, ref_k, cos, sin)
    _ops(backend)["rope"](q, k, cos.to(backend[1]), sin.to(backend[1]))
    close(q.reshape(b * t, h, d), *want_q[:1], dtype, scale=want_q[1])
    close(k.reshape(b * t, hk, d), *want_k[:1], dtype, scale=want_k[1])
    same_as_reference(backend, q.reshape(b * t, h, d), ref_q.reshape(b * t, h, d), dtype,
                      scale=want_q[1])
    same_as_reference(backend, k.reshape(b * t, hk, d), ref_k.reshape(b * t, hk, d), dtype,
                      scale=want_k[1])
    assert torch.equal(qkv[..., (h + hk) * d:], before[..., (h + hk) * d:])  # v untouched
    if rotary == "partial":
        assert torch.equal(
            q[..., rot:].cpu(), before[..., : h * d].view(b, t, h, d)[..., rot:].cpu()
        )


@pytest.mark.parametrize("rotary", [32, 8])
def test_cpu_float32_rope_equals_the_reference_bit_for_bit(rotary):
    """models/layers.py `rope` on the CPU in float32 (q and k rotated together, the reference's
    own products and sums) returns exactly `rope_ref`'s values, full and partial rotary."""
    from services.worker.models import layers
    gen = np.random.default_rng(7)
    qkv = rand(gen, (2, 3, (4 + 2 * 2) * 32), torch.float32, "cpu")
    q, k = qkv[..., :128].view(2, 3, 4, 32), qkv[..., 128:192].view(2, 3, 2, 32)
    ang = torch.from_numpy(gen.uniform(0, 50, (2, 3, rotary // 2))).float()
    cos, sin = ang.cos(), ang.sin()
    got_q, got_k = layers.rope(q, k, cos, sin)
    assert torch.equal(got_q, rope_ref(q, cos, sin)) and torch.equal(got_k, rope_ref(k, cos, sin))


def test_rope_reference_is_the_serving_module():
    """With the full rotary dimension the reference equals
    services/worker/models/rope.apply_rope."""
    from services.worker.models.rope import apply_rope
    gen = np.random.default_rng(6)
    x = rand(gen, (2, 5, 3, 16), torch.bfloat16, "cpu")
    ang = torch.from_numpy(gen.uniform(0, 50, (2, 5, 8))).float()
    cos, sin = ang.cos(), ang.sin()
    y, k = x.clone(), x[..., :1, :].clone()
    apply_rope_ref_(y, k, cos, sin)
    assert torch.equal(y, apply_rope(x, cos, sin))


def test_rope_rejects_bad_inputs():
    from kernels.rope import apply_rope_
    q, k = torch.zeros(2, 4, 16), torch.zeros(2, 2, 16)
    with pytest.raises(ValueError, match="cos, sin"):
        apply_rope_(q, k, torch.zeros(2, 9), torch.zeros(2, 9))  # R = 18 > D
    with pytest.raises(ValueError, match="cos, sin: expected float32"):
        apply_rope_(q, k, torch.zeros(2, 8, dtype=torch.float64), torch.zeros(2, 8))
    with pytest.raises(ValueError, match="k: expected"):
        apply_rope_(q, torch.zeros(3, 2, 16), torch.zeros(2, 8), torch.zeros(2, 8))


# ----------------------------------------------------------------------------- SwiGLU


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swiglu_matches_float64(backend, dtype):
    """The MLP's silu(gate_proj(m)) * up_proj(m) on a fused gate|up output: gate first, then up."""
    gen = np.random.default_rng(7)
    for shape in [(3, 2 * 37), (2, 3, 2 * 1500)]:
        x = rand(gen, shape, dtype, backend[1], 3.0)
        y = _ops(backend)["swiglu"](x)
        assert y.shape == shape[:-1] + (shape[-1] // 2,) and y.dtype == dtype
        x64 = x.cpu().double().numpy()
        g, u = np.split(x64, 2, axis=-1)
        close(y, g / (1 + np.exp(-g)) * u, dtype)
        same_as_reference(backend, y, swiglu_ref(x.cpu()), dtype)


def test_swiglu_rejects_odd_width():
    from kernels.swiglu import swiglu
    with pytest.raises(ValueError, match=r"\[\.\.\., 2I\]"):
        swiglu(torch.zeros(2, 7))


# ----------------------------------------------------------------------------- GPU shapes


@pytest.mark.gpu
def test_layers_at_qwen3_8b_shapes_on_cuda():
    """Real shapes (hidden 4096, 32/8 heads of 128, intermediate 12288, B = 64) against the
    references, bf16."""
    from kernels.norms import add_rms_norm, rms_norm
    from kernels.rope import apply_rope_
    from kernels.swiglu import swiglu
    g = torch.Generator(device="cuda").manual_seed(0)
    dt = torch.bfloat16
    x = torch.randn(64, 4096, device="cuda", generator=g).to(dt)
    r = torch.randn(64, 4096, device="cuda", generator=g).to(dt)
    w = torch.randn(4096, device="cuda", generator=g).to(dt)
    for z in (False, True):
        # two roundings (normalised value, then the weight product) may each differ by a unit
        torch.testing.assert_close(rms_norm(x, w, 1e-6, zero_centered=z),
                                   rms_norm_ref(x, w, 1e-6, zero_centered=z),
                                   rtol=2.01 * UNIT[dt], atol=1e-6)
        y, h = add_rms_norm(x, r, w, 1e-6, zero_centered=z)
        wy, wh = add_rms_norm_ref(x, r, w, 1e-6, zero_centered=z)
        assert torch.equal(h, wh)
        torch.testing.assert_close(y, wy, rtol=2.01 * UNIT[dt], atol=1e-6)
    qkv = torch.randn(64, 1, 48 * 128, device="cuda", generator=g).to(dt)
    q, k = qkv[..., :4096].view(64, 1, 32, 128), qkv[..., 4096:5120].view(64, 1, 8, 128)
    ang = torch.rand(64, 1, 64, device="cuda", generator=g) * 4000
    rq, rk = q.clone(), k.clone()
    apply_rope_ref_(rq, rk, ang.cos(), ang.sin())
    apply_rope_(q, k, ang.cos(), ang.sin())
    torch.testing.assert_close(q, rq, rtol=UNIT[dt], atol=UNIT[dt])
    torch.testing.assert_close(k, rk, rtol=UNIT[dt], atol=UNIT[dt])
    gu = torch.randn(64, 2 * 12288, device="cuda", generator=g).to(dt)
    torch.testing.assert_close(swiglu(gu), swiglu_ref(gu), rtol=2.01 * UNIT[dt], atol=UNIT[dt])
    assert math.isfinite(float(swiglu(gu).float().sum()))


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_layer_kernels_under_interpreter():
    """Every backend scenario above on the Triton kernels in a fresh interpreted process."""
    run_interpreted(__file__)
