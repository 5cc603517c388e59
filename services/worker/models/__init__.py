"""Model code of the GPU worker: our own Llama-family dense decoder, its KV cache and loaders."""

from services.worker.models.config import ModelConfig, ModelConfigError, RopeConfig
from services.worker.models.dense import DenseDecoder
from services.worker.models.gguf_loading import load_default_model, load_gguf_model
from services.worker.models.hf_loading import load_hf_model
from services.worker.models.kv_cache import KVCache

__all__ = [
    "DenseDecoder",
    "KVCache",
    "ModelConfig",
    "ModelConfigError",
    "RopeConfig",
    "load_default_model",
    "load_gguf_model",
    "load_hf_model",
]
