"""Random-weight Qwen3.5 models of a given shape for tests and benchmarks (structure only, never
a quality claim); a checkpoint directory's runtime is services/worker/runtime.py's `load_runtime`
(weights by models/qwen35_loading.py, the Frontend from `get_frontend(path)`).

- `random_qwen35(dtype=, device=, **overrides)`: a Qwen35Model of the 9B text shape (32 layers,
  hidden 4096, 24 GDN + 8 attention, the real vocabulary) unless overridden, built on `device`.
"""

from __future__ import annotations

from typing import Any

import torch

from services.worker.models.qwen35 import Qwen35Model
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.rope import RopeConfig

# The Qwen3.5-9B text model (transformers' Qwen3_5TextConfig defaults).
QWEN35_9B: dict[str, Any] = dict(
    vocab_size=248_320, hidden_size=4096, intermediate_size=12288,
    layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(32)),
    num_heads=16, num_kv_heads=4, head_dim=256, rotary_dim=64, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128, linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6, max_position_embeddings=262_144, rope=RopeConfig(theta=1e7), tie_word_embeddings=False,
)


@torch.no_grad()
def random_qwen35(*, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda", seed: int = 0,
                  mtp: bool = False, **overrides: Any) -> Qwen35Model:
    """A random-weight Qwen35Model of QWEN35_9B's shape with `overrides` (Qwen35Config fields,
    e.g. num_layers via layer_types), in eval mode on `device`. Linear weights ~ N(0, 1/fan_in),
    embeddings ~ N(0, 1), norms at their identity, A_log = log U(1, 16), dt_bias 1, drawn from
    `seed`. Raises ModelConfigError for an invalid shape."""
    config = Qwen35Config(**{**QWEN35_9B, **overrides})
    model = Qwen35Model(config, dtype=dtype, device="meta", mtp=mtp).to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for name, p in model.named_parameters():
        if name.endswith("linear_attn.norm.weight"):
            p.fill_(1.0)  # the gated norm multiplies by w
        elif name.endswith("norm.weight"):
            p.zero_()  # zero-centred: x_hat * (1 + w)
        elif name.endswith("A_log"):
            p.uniform_(1.0, 16.0, generator=gen).log_()
        elif name.endswith("dt_bias"):
            p.fill_(1.0)
        else:
            std = 1.0 if name.endswith("embed_tokens.weight") else p.shape[-1] ** -0.5
            p.normal_(0.0, std, generator=gen)
    model.reset_rope(device)
    model.fuse_projections()
    return model.eval().requires_grad_(False)

