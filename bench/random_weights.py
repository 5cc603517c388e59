"""Random-weight models for tests and benchmarks (structure only: timings and exactness, never a
quality claim): a small Llama-shaped model over any token domain with its `ByteTokenizer`, the
Qwen3.5-9B text shape (`QWEN35_9B`, `random_qwen35`), and runtimes of real shapes over the Qwen3.5
vocabulary (`random_qwen3_runtime`, `random_qwen35_runtime`), and a random DFlash / DFlash2 draft
checkpoint directory for any of these targets (`write_random_dflash`)."""

from __future__ import annotations

from typing import Any

import torch

from services.worker.models import DenseDecoder, ModelConfig, RopeConfig
from services.worker.models.qwen35 import Qwen35Model
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.runtime import ModelRuntime, SamplingDefaults
from shared.errors import InvalidRequest
from shared.frontends.frontend import Frontend, TiktokenTokenizer
from shared.frontends.token_domain import TokenDomain

# Qwen3-8B's shape (config.json of Qwen/Qwen3-8B); the vocabulary is the domain's.
QWEN3_8B_SHAPE = {"hidden_size": 4096, "intermediate_size": 12288, "num_layers": 36,
                  "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}

class ByteTokenizer:
    """Tokenizer of a byte-level test domain: special spellings to their ids, every other byte to
    the id whose token is exactly that byte (merges are never produced: prompts only)."""

    def __init__(self, domain: TokenDomain) -> None:
        self._specials = sorted(domain.special_names, key=lambda kv: -len(kv[0]))
        self._byte_ids = {}
        for i, b in enumerate(domain.token_bytes):
            if len(b) == 1 and domain.is_ordinary(i):
                self._byte_ids.setdefault(b[0], i)
        missing = [b for b in range(256) if b not in self._byte_ids]
        self._missing = frozenset(missing)

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        i = 0
        while i < len(text):
            for spelling, token_id in self._specials:
                if text.startswith(spelling, i):
                    out.append(token_id)
                    i += len(spelling)
                    break
            else:
                for b in text[i].encode("utf-8"):
                    if b in self._missing:
                        raise InvalidRequest(f"byte {b:#04x} has no token in this domain",
                                             field="prompt")
                    out.append(self._byte_ids[b])
                i += 1
        return out


def random_runtime(domain: TokenDomain, *, name: str | None = None, hidden_size: int = 64,
                   num_layers: int = 2, num_heads: int = 4, num_kv_heads: int = 2,
                   max_position_embeddings: int = 1024, seed: int = 0,
                   dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   defaults: SamplingDefaults = SamplingDefaults()) -> ModelRuntime:
    """A small random-weight Llama-shaped model over `domain` (logits width = domain.size), with
    a `ByteTokenizer`; weights are drawn from `seed` (default 0) with a scale that keeps logits
    spread enough for greedy decoding to vary."""
    config = ModelConfig(
        architecture="llama", vocab_size=domain.size, hidden_size=hidden_size,
        intermediate_size=2 * hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, head_dim=hidden_size // num_heads, rms_norm_eps=1e-5,
        max_position_embeddings=max_position_embeddings,
    )
    gen = torch.Generator().manual_seed(seed)
    decoder = DenseDecoder(config, dtype=dtype)
    with torch.no_grad():
        for pname, p in decoder.named_parameters():
            if pname.endswith("norm.weight"):
                continue
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype) * 0.5)
    decoder = decoder.to(device).eval().requires_grad_(False)
    decoder.fuse_projections()
    name = name or domain.name
    return ModelRuntime(name, decoder, config, Frontend(name, domain, ByteTokenizer(domain)),
                        defaults)


# The Qwen3.5-9B text model (transformers' Qwen3_5TextConfig defaults).
QWEN35_9B: dict[str, Any] = dict(
    vocab_size=248_320, hidden_size=4096, intermediate_size=12288,
    layer_types=tuple("full_attention" if (i + 1) % 4 == 0 else "linear_attention"
                      for i in range(32)),
    num_heads=16, num_kv_heads=4, head_dim=256, rotary_dim=64, linear_num_key_heads=16,
    linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    linear_conv_kernel_dim=4, rms_norm_eps=1e-6, max_position_embeddings=262_144,
    rope=RopeConfig(theta=1e7), tie_word_embeddings=False,
)


@torch.no_grad()
def random_qwen35(*, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cuda",
                  seed: int = 0, mtp: bool = False, **overrides: Any) -> Qwen35Model:
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


@torch.no_grad()
def random_qwen3_runtime(domain: TokenDomain, tokenizer, *, name: str = "qwen3-8b-random",
                         shape: dict[str, int] = QWEN3_8B_SHAPE,
                         max_position_embeddings: int = 4096,
                         seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                         device: str | torch.device = "cuda") -> ModelRuntime:
    """A random-weight Qwen3 model (q/k RMSNorm, RoPE theta 1e6, untied head) of `shape` (default
    Qwen3-8B's) over `domain`, built directly on `device`. Linear weights ~ N(0, 1/fan_in),
    embeddings ~ N(0, 1), norms 1, drawn from `seed` (default 0)."""
    config = ModelConfig(architecture="qwen3", vocab_size=domain.size, rms_norm_eps=1e-6,
                         max_position_embeddings=max_position_embeddings,
                         rope=RopeConfig(theta=1e6), qk_norm=True, **shape)
    decoder = DenseDecoder(config, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for pname, p in decoder.named_parameters():
        if pname.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            std = 1.0 if pname.endswith("embed_tokens.weight") else p.shape[-1] ** -0.5
            p.normal_(0.0, std, generator=gen)
    decoder = decoder.eval().requires_grad_(False)
    decoder.fuse_projections()
    return ModelRuntime(name, decoder, config, Frontend(name, domain, tokenizer))


@torch.no_grad()
def random_qwen35_runtime(*, name: str = "qwen35-9b-random", dtype: torch.dtype = torch.bfloat16,
                          device: str | torch.device = "cuda", **overrides) -> ModelRuntime:
    """The random-weight Qwen3.5-9B-shaped text model (`random_qwen35`, `overrides` its config
    fields) over the Qwen3.5 vocabulary, raw-text prompts."""
    from shared.frontends import get_domain
    from shared.frontends.qwen35 import qwen35_tokenizer

    model = random_qwen35(dtype=dtype, device=device, **overrides)
    return ModelRuntime(name, model, model.config,
                        Frontend(name, get_domain("qwen3.5"),
                                 TiktokenTokenizer(qwen35_tokenizer())))


@torch.no_grad()
def write_random_dflash(path: str, target, *, mask_token_id: int, dflash2: bool = False,
                        layers: int = 2, block: int = 5,
                        target_layer_ids: tuple[int, ...] | None = None, seed: int = 0,
                        std: float | None = None, dtype: torch.dtype = torch.float32,
                        device: str | torch.device = "cpu", config: dict | None = None,
                        dflash_config: dict | None = None) -> dict:
    """Write a random-weight DFlash (or DFlash2) draft checkpoint for a target of config
    `target` (a dense ModelConfig or a Qwen35Config: its width, heads, vocabulary) into directory
    `path`: config.json (`dflash_config` with target_layer_ids, mask_token_id, block_size) and
    model.safetensors under the tensor names `load_dflash` reads. `target_layer_ids` index the
    target's layers, any kind (default: up to five spread over the middle layers); `config` and
    `dflash_config` override keys of config.json and of its `dflash_config`. Weights ~ N(0,
    std^2) (default std 1/sqrt(fan_in)) drawn from `seed`, norms at one. Returns the config."""
    import json
    import os

    from safetensors.torch import save_file

    from services.worker.models.dflash import DFlashConfig, DFlashDraft

    t = target
    if target_layer_ids is None:
        n = max(1, min(5, t.num_layers - 2))
        ids = sorted({1 + round(i * (t.num_layers - 4) / max(1, n - 1)) for i in range(n)})
        target_layer_ids = tuple(min(max(i, 0), t.num_layers - 1) for i in ids)
    raw = {"architectures": ["DFlash2DraftModel" if dflash2 else "DFlashDraftModel"],
           "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
           "num_hidden_layers": layers, "num_attention_heads": t.num_heads,
           "num_key_value_heads": t.num_kv_heads, "head_dim": t.head_dim,
           "rms_norm_eps": t.rms_norm_eps, "vocab_size": t.vocab_size,
           "rope_parameters": {"rope_theta": 1e6, "rope_type": "default"},
           "dflash_config": {"block_size": block, "mask_token_id": mask_token_id,
                             "target_layer_ids": list(target_layer_ids)}}
    if dflash2:
        raw["dflash_config"].update(conv_kernel_size=2, conv_group_size=16, selector_rank=256,
                                    selector_top_k=16)
    raw.update(config or {})
    raw["dflash_config"].update(dflash_config or {})
    model = DFlashDraft(DFlashConfig.from_dict(raw), dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = {}
    for name, p in model.state_dict().items():
        if name.endswith("norm.weight"):
            tensors[name] = torch.ones_like(p).cpu()
        else:
            s = p.shape[-1] ** -0.5 if std is None else std
            tensors[name] = torch.empty_like(p).normal_(0.0, s, generator=gen).cpu()
    with open(os.path.join(path, "config.json"), "w", encoding="utf-8") as f:
        json.dump(raw, f)
    save_file(tensors, os.path.join(path, "model.safetensors"))
    return raw
