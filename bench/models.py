"""The benchmark's models: the built-in default, and random-weight models of real shapes over the
Qwen3.5 vocabulary (bench/random_weights.py; structure only: timings, never quality), plus
prompts of a given length."""

from __future__ import annotations

import torch

from bench.random_weights import random_qwen3_runtime, random_qwen35_runtime
from services.worker.runtime import ModelRuntime, load_runtime
from shared.frontends.frontend import TiktokenTokenizer

_SENTENCE = "The quick brown fox {k} jumps over the lazy dog while the band plays on. "


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
    raise ValueError(f"unknown model {model!r} (bench/cli.py's MODELS are the known ones)")


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


