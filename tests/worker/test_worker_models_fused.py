"""The fused layer path (models/layers.py, fused q|k|v and gate|up GEMMs) against the op-by-op
path it replaces, on the same weights: the same logits within rounding and the same greedy tokens.

Issue 14: "Fused q|k|v and gate|up weights at load time"; "the fused path must give the same greedy
outputs as before". The CPU ops are compared with the kernels' torch references here; the Triton
kernels with the same references in tests/kernels/test_kernels_layers.py.
"""

from __future__ import annotations

import pytest
import torch

from kernels.norms_ref import add_rms_norm_ref, rms_norm_ref
from kernels.rope_ref import rope_ref
from kernels.swiglu_ref import swiglu_ref
from services.worker.models import DenseDecoder, ModelConfig, RopeConfig
from services.worker.models import layers as ops


def _model(qk_norm: bool, dtype: torch.dtype, seed: int = 0) -> DenseDecoder:
    config = ModelConfig(
        architecture="qwen3" if qk_norm else "llama",
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_layers=3,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        max_position_embeddings=256,
        rope=RopeConfig(theta=1e4),
        qk_norm=qk_norm,
    )
    model = DenseDecoder(config, dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.2 if name.endswith("norm.weight") else p.shape[-1] ** -0.5
            base = 1.0 if name.endswith("norm.weight") else 0.0
            p.copy_(
                (base + scale * torch.randn(p.shape, generator=gen, dtype=torch.float64)).to(dtype)
            )
    return model.eval().requires_grad_(False)


def _greedy(model: DenseDecoder, prompt: list[int], steps: int) -> tuple[list[int], torch.Tensor]:
    """Greedy continuation through the KV cache; also the prompt's logits."""
    cache = model.new_state(2, 64, dtype=next(model.parameters()).dtype, device="cpu")
    lanes = torch.tensor([1])
    with torch.inference_mode():
        logits = model(torch.tensor([prompt]), torch.arange(len(prompt))[None], cache, lanes)
        first = logits.float().clone()
        out = []
        for i in range(steps):
            token = int(logits[0, -1].argmax())
            out.append(token)
            logits = model(torch.tensor([[token]]), torch.tensor([[len(prompt) + i]]), cache, lanes)
    return out, first


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_path_matches_the_op_by_op_path(qk_norm, dtype):
    """fuse_projections keeps state_dict names and memory; the fused forward gives the same
    greedy tokens and logits within rounding of the unfused forward on the same weights."""
    model = _model(qk_norm, dtype)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt = [3, 14, 15, 92, 65, 35, 89, 79, 32, 38]
    want_tokens, want_logits = _greedy(model, prompt, 12)
    model.fuse_projections()
    assert model.fused
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    attn = model.model.layers[0].self_attn
    fused = attn.fused_q_proj
    assert attn.q_proj.weight.data_ptr() == fused.data_ptr()  # a slice of the fused matrix
    assert attn.k_proj.weight.data_ptr() == fused[attn.q_proj.weight.shape[0]:].data_ptr()
    got_tokens, got_logits = _greedy(model, prompt, 12)
    assert got_tokens == want_tokens
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(got_logits, want_logits, atol=tol, rtol=tol)
    model.fused = False  # the "before" path runs on the fused weights too
    again, _ = _greedy(model, prompt, 12)
    assert again == want_tokens


def test_fused_flag_requires_fusion():
    model = _model(False, torch.float32)
    with pytest.raises(ValueError, match="fuse_projections"):
        model.fused = True


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_centered", [False, True])
def test_cpu_ops_follow_the_kernel_references(dtype, zero_centered):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 32, generator=gen).to(dtype)
    r = torch.randn(2, 3, 4, 32, generator=gen).to(dtype)
    w = (1 + 0.1 * torch.randn(32, generator=gen)).to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=0, rtol=0)
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-6, zero_centered=zero_centered),
                               rms_norm_ref(x, w, 1e-6, zero_centered=zero_centered), **tol)
    y, h = ops.add_rms_norm(x, r, w, 1e-6, zero_centered=zero_centered)
    y_ref, h_ref = add_rms_norm_ref(x, r, w, 1e-6, zero_centered=zero_centered)
    torch.testing.assert_close(h, h_ref, atol=0, rtol=0)
    torch.testing.assert_close(y, y_ref, **tol)
    # a strided head view (q of a fused projection) normalises like a contiguous copy
    qkv = torch.randn(2, 3, 6 * 32, generator=gen).to(dtype)
    q = qkv[..., :4 * 32].view(2, 3, 4, 32)
    torch.testing.assert_close(
        ops.rms_norm(q, w, 1e-6), rms_norm_ref(q.contiguous(), w, 1e-6), **tol
    )
    # RoPE, full and partial rotary dimension
    for half in (16, 8):
        cos, sin = torch.rand(2, 3, half, generator=gen), torch.rand(2, 3, half, generator=gen)
        k = qkv[..., 4 * 32:5 * 32].view(2, 3, 1, 32)
        qr, kr = ops.rope(q, k, cos, sin)
        torch.testing.assert_close(qr, rope_ref(q, cos, sin), atol=0, rtol=0)
        torch.testing.assert_close(kr, rope_ref(k, cos, sin), atol=0, rtol=0)
    gu = torch.randn(5, 64, generator=gen).to(dtype)
    torch.testing.assert_close(ops.swiglu(gu), swiglu_ref(gu), atol=0, rtol=0)


def test_loaders_fuse():
    """The loaders hand out fused models (hf_loading.build_model, random_runtime)."""
    from tests.support.worker_support import tiny_runtime

    assert tiny_runtime().model.fused


# ----------------------------------------------------------------------------- Triton, interpreted

from tests.support.kernel_backends import INTERPRETED, run_interpreted  # noqa: E402


@pytest.mark.skipif(not INTERPRETED, reason="runs inside the interpreted child pytest")
@pytest.mark.parametrize("qk_norm", [False, True])
def test_interpreter_kernels_serve_the_fused_model(qk_norm, monkeypatch):
    """The Triton kernels (interpreted on the CPU) on the fused model's real call sites: strided
    q/k head views of the q|k|v output, in-place RoPE, the residual-fused norms, SwiGLU on the
    gate|up output; the same greedy tokens and logits within rounding as the op-by-op path."""
    model = _model(qk_norm, torch.float32, seed=2)
    prompt = [5, 17, 3, 88, 41, 9]
    want_tokens, want_logits = _greedy(model, prompt, 4)
    model.fuse_projections()
    monkeypatch.setattr(ops, "uses_kernels", lambda x: x.dtype in (torch.float32, torch.bfloat16))
    got_tokens, got_logits = _greedy(model, prompt, 4)
    assert got_tokens == want_tokens
    torch.testing.assert_close(got_logits, want_logits, atol=1e-4, rtol=1e-4)


@pytest.mark.skipif(INTERPRETED, reason="this process is the interpreter run itself")
def test_fused_model_under_interpreter():
    run_interpreted(__file__, timeout=600)


@pytest.mark.skipif(not INTERPRETED, reason="runs inside the interpreted child pytest")
def test_interpreter_kernels_serve_qwen35(monkeypatch):
    """Issue 14: "the same kernels serve the Qwen3.5 model's attention layers and MLPs": the
    zero-centred Triton norms (per head on q of the q|gate projection, the residual-fused
    post-attention norm), partial-rotary RoPE in place and SwiGLU give the op-by-op path's
    logits."""
    from bench.random_weights import random_qwen35

    model = random_qwen35(dtype=torch.float32, device="cpu", seed=4, vocab_size=64, hidden_size=32,
                          intermediate_size=48, layer_types=("linear_attention", "full_attention"),
                          num_heads=2, num_kv_heads=1, head_dim=16, rotary_dim=4,
                          linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=8,
                          linear_value_head_dim=8)
    with torch.no_grad():  # norms away from their identity, so the weights matter
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("q_norm.weight") \
                    or name.endswith("k_norm.weight") or name.endswith("model.norm.weight"):
                p.normal_(0.0, 0.3)
        for module in model.modules():
            if hasattr(module, "freeze"):
                module.freeze()
    monkeypatch.setattr(ops, "uses_kernels", lambda x: x.dtype == torch.float32)
    tokens = torch.tensor([[5, 9, 33, 2, 17, 40, 8]])
    positions = torch.arange(7)[None]
    out = {}
    with torch.inference_mode():
        for fused in (False, True):
            model.fused = fused
            state = model.new_state(2, 16, dtype=torch.float32, device="cpu")
            out[fused] = model(tokens, positions, state, torch.tensor([1]))
    assert model.fused
    torch.testing.assert_close(out[True], out[False], atol=1e-4, rtol=1e-4)


def test_fused_path_taps_the_same_residual_stream():
    """A draft model reads the residual stream after chosen layers (`hidden_states(tap=...)`,
    DFlash): the fused path, whose residual adds live inside the norms, returns the same
    streams as the op-by-op path."""
    model = _model(True, torch.float32, seed=6)
    tokens = torch.tensor([[4, 8, 15, 16, 23, 42]])
    positions = torch.arange(6)[None]
    out = {}
    with torch.inference_mode():
        for fused in (False, True):
            if fused:
                model.fuse_projections()
            cache = model.new_state(1, 16, dtype=torch.float32, device="cpu")
            out[fused] = model.hidden_states(
                tokens, positions, cache, torch.tensor([0]), tap=(0, 2)
            )
    for got, want in zip(out[True], out[False]):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert out[True][1].shape == (1, 6, 2 * 64)
