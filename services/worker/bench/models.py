"""The benchmark's models: the built-in default, and random-weight models of real shapes over the
Qwen3.5 vocabulary (structure only: timings, never quality), plus prompts of a given length."""

from __future__ import annotations

import torch

from services.worker.bench.cli import MODELS
from services.worker.models import DenseDecoder, ModelConfig, RopeConfig
from services.worker.runtime import ModelRuntime, load_runtime
from shared.frontends.frontend import Frontend, TiktokenTokenizer
from shared.frontends.token_domain import TokenDomain

# Qwen3-8B's shape (config.json of Qwen/Qwen3-8B); the vocabulary is the domain's.
QWEN3_8B_SHAPE = {"hidden_size": 4096, "intermediate_size": 12288, "num_layers": 36,
                  "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
_SENTENCE = "The quick brown fox {k} jumps over the lazy dog while the band plays on. "


@torch.no_grad()
def random_qwen3_runtime(domain: TokenDomain, tokenizer, *, name: str = "qwen3-8b-random",
                         shape: dict[str, int] = QWEN3_8B_SHAPE, max_position_embeddings: int = 4096,
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
    """The random-weight Qwen3.5-9B-shaped text model (models/qwen35_runtime.py `random_qwen35`,
    `overrides` its config fields) over the Qwen3.5 vocabulary, raw-text prompts."""
    from services.worker.models.qwen35_runtime import random_qwen35
    from shared.frontends import get_domain
    from shared.frontends.qwen35 import qwen35_tokenizer

    model = random_qwen35(dtype=dtype, device=device, **overrides)
    return ModelRuntime(name, model, model.config,
                        Frontend(name, get_domain("qwen3.5"), TiktokenTokenizer(qwen35_tokenizer())))


def build_runtime(model: str, device: str) -> ModelRuntime:
    """The benchmark's runtime: bf16 on CUDA, float32 on the CPU. Raises ValueError for an
    unknown model name."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if model == "smollm2":
        return load_runtime("smollm2", device=device, dtype=dtype)
    if model == "qwen3-8b-random":
        from shared.frontends import get_domain
        from shared.frontends.qwen35 import qwen35_tokenizer

        return random_qwen3_runtime(get_domain("qwen3.5"), TiktokenTokenizer(qwen35_tokenizer()),
                                    dtype=dtype, device=device)
    if model == "qwen35-9b-random":
        return random_qwen35_runtime(dtype=dtype, device=device)
    raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")


def prompt_texts(runtime: ModelRuntime, count: int, tokens: int) -> list[str]:
    """`count` distinct raw-text prompts of at least `tokens` tokens (a few more at most)."""
    out = []
    for i in range(count):
        text, k = f"Request {i}. ", 0
        while len(runtime.tokenizer.encode(text)) < tokens:
            text += _SENTENCE.format(k=k)
            k += 1
        while k and len(runtime.tokenizer.encode(text[:-1])) >= tokens:
            text = text[:-1]
        out.append(text)
    return out


