"""Shared helpers of the Qwen3.5 model tests: a tiny random transformers Qwen3.5 (with the real
248,320-row vocabulary) saved with save_pretrained, random MTP tensors, and our serving path."""

from __future__ import annotations

import contextlib

import torch

VOCAB = 248_320  # the real Qwen3.5 embedding rows (shared/frontends/qwen35.py EMBEDDING_ROWS)
LAYER_TYPES = [
    "linear_attention",
    "linear_attention",
    "full_attention",
    "linear_attention",
    "full_attention",
]
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=8,
    linear_conv_kernel_dim=4,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.25,
        "mrope_section": [1, 1, 0],
        "mrope_interleaved": True,
    },
)


def text_config(**overrides):
    import transformers

    cfg = transformers.Qwen3_5TextConfig(**{**TINY, **overrides})
    cfg._attn_implementation = "eager"
    return cfg


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Weights that keep activations O(1) and logits spread (norm weights away from their init)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.rand(p.shape, generator=g) * 2 - 1)
            elif name.endswith("dt_bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            elif "norm" in name:
                p.copy_(
                    (1.0 if name.endswith("linear_attn.norm.weight") else 0.0)
                    + 0.3 * torch.randn(p.shape, generator=g)
                )
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 * 1.5)


def hf_causal_lm(seed: int = 0, **overrides):
    import transformers

    torch.manual_seed(seed)
    hf = transformers.Qwen3_5ForCausalLM(text_config(**overrides)).eval()
    randomize_(hf, seed)
    return hf


def mtp_tensors(hidden: int, cfg, seed: int) -> dict[str, torch.Tensor]:
    """Random `mtp.*` tensors named as Qwen3.5 checkpoints name them, built from a transformers
    full-attention decoder layer's own parameter names (so the names are not ours)."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    layer = m.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention"))
    randomize_(layer, seed)
    g = torch.Generator().manual_seed(seed + 1)
    out = {f"mtp.layers.0.{k}": v.detach().clone() for k, v in layer.state_dict().items()}
    out["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden, generator=g) / (2 * hidden) ** 0.5
    for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{norm}.weight"] = 0.3 * torch.randn(hidden, generator=g)
    return out


def add_tensors(path: str, tensors: dict[str, torch.Tensor]) -> None:
    """Write `tensors` as one more safetensors shard of checkpoint directory `path`."""
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, f"{path}/extra-mtp.safetensors")


@contextlib.contextmanager
def torch_gated_delta_rule():
    """transformers' own torch gated delta rule inside the block. Where fla is installed (the GPU
    extra) transformers binds fla's Triton kernels at import, whatever the tensors' device (CPU
    tensors then crash in Triton); the reference must stay transformers' torch implementation, so
    the module's two rule functions are swapped for the torch functions they wrap."""
    from transformers.models.qwen3_5 import modeling_qwen3_5 as modeling

    names = ("torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule")
    saved = {name: getattr(modeling, name) for name in names if hasattr(modeling, name)}
    try:
        for name, fn in saved.items():
            setattr(modeling, name, getattr(fn, "__wrapped__", fn))
        yield
    finally:
        for name, fn in saved.items():
            setattr(modeling, name, fn)


def reference_logits(hf_model, sequences: list[list[int]]) -> list[torch.Tensor]:
    """transformers' logits [n, V] float32 for each whole sequence, no cache (its torch path)."""
    out = []
    with torch.no_grad(), torch_gated_delta_rule():
        for seq in sequences:
            out.append(hf_model(input_ids=torch.tensor([seq]), use_cache=False).logits[0].float())
    return out


def run_schedule(
    model,
    state,
    lanes: list[int],
    sequences: list[list[int]],
    schedule,
    *,
    pad_token: int = 7,
    device="cpu",
) -> list[torch.Tensor]:
    """Feed `sequences` by `schedule` (per step, tokens per row; 0 = the row sits out), committing
    every step whole. Rows are right-padded with `pad_token` at continuing positions and pass
    num_tokens. Returns per row the logits [n, V] float32 of every real token fed."""
    fed = [0] * len(sequences)
    out: list[list[torch.Tensor]] = [[] for _ in sequences]
    for counts in schedule:
        rows = [b for b, n in enumerate(counts) if n]
        T = max(counts[b] for b in rows)
        tokens = torch.full((len(rows), T), pad_token, dtype=torch.long)
        positions = torch.empty((len(rows), T), dtype=torch.long)
        for r, b in enumerate(rows):
            n = counts[b]
            tokens[r, :n] = torch.tensor(sequences[b][fed[b]:fed[b] + n])
            positions[r] = torch.arange(fed[b], fed[b] + T)
        num = torch.tensor([counts[b] for b in rows], device=device)
        lane_t = torch.tensor([lanes[b] for b in rows], device=device)
        with torch.no_grad():
            logits = model(tokens.to(device), positions.to(device), state, lane_t, num_tokens=num)
            state.commit(lane_t, num)
        for r, b in enumerate(rows):
            out[b].append(logits[r, :counts[b]].float().cpu())
            fed[b] += counts[b]
    return [torch.cat(o) for o in out]


def assert_close(ours: torch.Tensor, ref: torch.Tensor, rel: float, what: str = "") -> None:
    """Every value within rel * (largest reference magnitude) of the reference."""
    assert ours.shape == ref.shape, (what, ours.shape, ref.shape)
    scale = ref.abs().max().item()
    err = (ours.float() - ref.float()).abs().max().item()
    assert err <= rel * scale, f"{what}: max |ours - ref| = {err:.3g}, scale {scale:.3g}"
