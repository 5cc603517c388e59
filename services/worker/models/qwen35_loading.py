"""Load a Qwen3.5 checkpoint directory (config.json + *.safetensors) into a `Qwen35Model`.

Accepted layouts (what transformers' `save_pretrained` writes and Hugging Face ships):

- `Qwen3_5ForConditionalGeneration`: text weights under `model.language_model.*`, the LM head as
  `lm_head.weight`, the vision tower under `model.visual.*` (skipped: never read from disk);
- `Qwen3_5ForCausalLM` (text only): `model.*` and `lm_head.weight`;
- either with `mtp.*` tensors, which load into the MTP module (absent: no MTP module).

The tokenizer files stay where they are (`source_path` names the directory).
"""

from __future__ import annotations

import json
import os

import torch

from services.worker.models.config import ModelConfigError
from services.worker.models.hf_loading import read_safetensors
from services.worker.models.qwen35 import Qwen35Model
from services.worker.models.qwen35_config import Qwen35Config, is_qwen35_config

_SKIPPED_PREFIXES = ("model.visual.", "visual.", "model.vision_tower.")
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


def read_config_json(path: str) -> dict:
    """The config.json of checkpoint directory `path` as a dictionary. Raises FileNotFoundError
    without it, ModelConfigError when it is not a JSON object."""
    with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
        try:
            raw = json.load(f)
        except json.JSONDecodeError as e:
            raise ModelConfigError("config.json", f"is not valid JSON: {e}") from e
    if not isinstance(raw, dict):
        raise ModelConfigError("config.json", "must hold a JSON object")
    return raw


def is_qwen35_checkpoint(path: str) -> bool:
    """True when directory `path` has a config.json naming a Qwen3.5 model."""
    try:
        return is_qwen35_config(read_config_json(path))
    except (FileNotFoundError, ModelConfigError):
        return False


def _our_name(name: str) -> str | None:
    """Our parameter name for checkpoint tensor `name`, or None for a tensor we never load."""
    if name.startswith(_SKIPPED_PREFIXES) or name.endswith(_IGNORED_SUFFIXES):
        return None
    if name.startswith("model.language_model."):
        return "model." + name[len("model.language_model."):]
    return name


def build_qwen35(config: Qwen35Config, state: dict[str, torch.Tensor], dtype: torch.dtype,
                 device: torch.device | str, source: str | None = None) -> Qwen35Model:
    """A Qwen35Model with weights `state` (our names, see `_our_name`; any float dtype). The MTP
    module exists when `state` has `mtp.*` tensors. Raises ModelConfigError naming missing,
    unexpected or misshapen weights."""
    has_mtp = any(k.startswith("mtp.") for k in state)
    model = Qwen35Model(config, dtype=dtype, device="meta", mtp=has_mtp)  # shapes only, no storage
    if config.tie_word_embeddings:
        state = {k: v for k, v in state.items() if k != "lm_head.weight"}  # the tied copy
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
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.reset_rope(device)
    model.fuse_projections()
    model.source_path = source
    return model.eval().requires_grad_(False)


def load_qwen35_model(path: str, dtype: torch.dtype = torch.float32,
                      device: torch.device | str = "cpu") -> tuple[Qwen35Model, Qwen35Config]:
    """Load the Qwen3.5 checkpoint directory `path` (see the module docstring), cast to `dtype` on
    `device`. Returns (model, config), the model in eval mode without gradients and
    `model.source_path == path`. Raises FileNotFoundError without config.json or safetensors,
    ModelConfigError for an unsupported config (a MoE variant, say) or mismatched weights."""
    config = Qwen35Config.from_hf(read_config_json(path))
    state = read_safetensors(path, _our_name)  # vision tensors (None) are never read
    return build_qwen35(config, state, dtype, device, path), config
