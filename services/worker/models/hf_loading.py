"""Load a Hugging Face checkpoint directory (config.json + *.safetensors) into a `DenseDecoder`.

The tokenizer files (tokenizer.json, the chat template) stay where they are: the model's
`source_path` names the directory for whoever builds the Frontend.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Callable

import torch

from services.worker.models.config import ModelConfig, ModelConfigError
from services.worker.models.dense import DenseDecoder

# Checkpoint entries that carry no weights of ours: old checkpoints saved RoPE tables.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_hf_config(path: str) -> ModelConfig:
    """ModelConfig of the checkpoint directory `path`. Raises FileNotFoundError without
    config.json, ModelConfigError for a malformed or unsupported one."""
    file = os.path.join(path, "config.json")
    with open(file, encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelConfigError("config.json", f"is not valid JSON: {e}") from e
    return ModelConfig.from_hf(raw)


def build_model(config: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype,
                device: torch.device | str, source: str) -> DenseDecoder:
    """A DenseDecoder with weights `state` (Hugging Face names, any float dtype). Raises
    ModelConfigError naming missing, unexpected or misshapen weights."""
    model = DenseDecoder(config, dtype=dtype, device="meta")  # shapes only, no storage
    state = {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # a tied checkpoint may still save the shared matrix
    expected = {k: v.shape for k, v in model.state_dict().items()}
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ModelConfigError(
            "weights",
            f"checkpoint does not match the config: missing {missing[:8]}, "
            f"unexpected {unexpected[:8]}",
        )
    for name, shape in expected.items():
        if tuple(state[name].shape) != tuple(shape):
            raise ModelConfigError(
                name, f"expected shape {tuple(shape)}, got {tuple(state[name].shape)}"
            )
    # Adopt the tensors themselves (no copy when dtype and device already match).
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.reset_rope(device)
    model.source_path = source
    model.fuse_projections()  # q|k|v and gate|up as one GEMM each, the fused layer path
    return model.eval().requires_grad_(False)


def load_hf_model(path: str, dtype: torch.dtype = torch.float32,
                  device: torch.device | str = "cpu") -> tuple[DenseDecoder, ModelConfig]:
    """Load the Llama/Qwen2/Qwen3 checkpoint directory `path` (config.json, *.safetensors, weights
    by their Hugging Face names), cast to `dtype` on `device`. Returns (model, config); the model is
    in eval mode without gradients and `model.source_path == path`. Raises FileNotFoundError
    without config.json or safetensors files, ModelConfigError for an unsupported config or
    mismatched weights."""
    config = read_hf_config(path)
    return build_model(config, read_safetensors(path), dtype, device, path), config


def read_safetensors(path: str, rename: Callable[[str], str | None] = lambda name: name
                     ) -> dict[str, torch.Tensor]:
    """Every tensor of checkpoint directory `path`'s *.safetensors files, on the CPU, under
    `rename(name)` (a name it maps to None is not read). Raises FileNotFoundError without such
    files. One reader for every checkpoint loader (dense, Qwen3.5, DFlash drafts)."""
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors file in {path}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(file, framework="pt", device="cpu") as f:
            for name in f.keys():
                ours = rename(name)
                if ours is not None:
                    state[ours] = f.get_tensor(name)
    return state
