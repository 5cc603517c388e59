"""The Qwen3.5 MTP module loaded from `mtp.*` tensors against an independent torch transcription
of its formula (issue 16: "MTP module output matches an independent torch transcription of the
formula": fc on [norm_emb(embed(x_{t+1})); norm_hid(h_t)], one full-attention decoder layer,
mtp.norm, the shared lm_head). The decoder layer of the transcription is transformers' own
Qwen3_5DecoderLayer holding the same tensors; the target hidden states are transformers' too.
"""

from __future__ import annotations

import pytest
import torch

from services.worker.models.qwen35_loading import load_qwen35_model
from tests.support.qwen35_support import VOCAB, add_tensors, assert_close, hf_causal_lm, mtp_tensors


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def zero_centred_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)


def transcription(hf, mtp: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    """Logits [T-1, V] predicting x_{t+2} from h_t and x_{t+1}, t = 0..T-2, positions 0..T-2."""
    import transformers.models.qwen3_5.modeling_qwen3_5 as m

    cfg = hf.config
    eps = cfg.rms_norm_eps
    with torch.no_grad():
        h = hf.model(input_ids=tokens[None], use_cache=False).last_hidden_state[
            0, :-1
        ]  # [T-1, H] normed
        e = hf.model.embed_tokens(tokens[1:])  # [T-1, H]
        u = torch.cat((zero_centred_rmsnorm(e, mtp["mtp.pre_fc_norm_embedding.weight"], eps),
                       zero_centred_rmsnorm(h, mtp["mtp.pre_fc_norm_hidden.weight"], eps)), dim=-1)
        u = u @ mtp["mtp.fc.weight"].T  # [T-1, H]
        layer = m.Qwen3_5DecoderLayer(cfg, cfg.layer_types.index("full_attention")).eval()
        layer.load_state_dict(
            {k[len("mtp.layers.0.") :]: v for k, v in mtp.items() if k.startswith("mtp.layers.0.")}
        )
        n = u.shape[0]
        positions = torch.arange(n)[None]
        rope = m.Qwen3_5TextRotaryEmbedding(cfg)(u[None], positions)
        causal = torch.full((n, n), float("-inf")).triu(1)[None, None]  # additive mask [1, 1, n, n]
        u = layer(u[None], position_embeddings=rope, attention_mask=causal, position_ids=positions)[
            0
        ]
        out = zero_centred_rmsnorm(u, mtp["mtp.norm.weight"], eps)
        return out @ hf.lm_head.weight.T


def test_mtp_matches_transcription(tmp_path):
    hf = hf_causal_lm(seed=10)
    hf.save_pretrained(str(tmp_path))
    mtp = mtp_tensors(hf.config.hidden_size, hf.config, seed=11)
    add_tensors(str(tmp_path), mtp)
    model, config = load_qwen35_model(str(tmp_path))
    assert model.mtp is not None
    g = torch.Generator().manual_seed(12)
    tokens = torch.randint(0, VOCAB, (14,), generator=g)
    ref = transcription(hf, mtp, tokens)  # [13, V]
    state = model.new_state(2, 32, dtype=torch.float32, device="cpu")
    lane = torch.tensor([1])
    with torch.no_grad():
        hidden = model.hidden_states(
            tokens[None], torch.arange(14)[None], state, lane
        )  # [1, 14, H]
        # the MTP layer's KV over two chunks: positions 0..8, then 9..12
        first, _ = model.mtp_forward(
            hidden[:, :9], tokens[None, 1:10], torch.arange(9)[None], state, lane
        )
        second, out = model.mtp_forward(
            hidden[:, 9:13],
            tokens[None, 10:14],
            torch.arange(9, 13)[None],
            state,
            lane,
            logit_index=torch.tensor([[3]]),
        )
    assert ref.abs().max() > 1.0
    assert_close(first[0], ref[:9], 2e-5, "first chunk")
    assert_close(second[0, 0], ref[12], 2e-5, "second chunk, gathered")
    assert out.shape == (1, 1, config.hidden_size)


def test_mtp_absent():
    """A model without mtp.* weights has no module (and its state no MTP KV); mtp_forward says
    so."""
    from bench.random_weights import random_qwen35

    model = random_qwen35(
        dtype=torch.float32,
        device="cpu",
        vocab_size=64,
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
    )
    state = model.new_state(1, 8, dtype=torch.float32, device="cpu")
    assert model.mtp is None and state.mtp_layer is None
    with pytest.raises(ValueError, match="mtp"):
        model.mtp_forward(
            torch.zeros(1, 1, 32),
            torch.zeros(1, 1, dtype=torch.long),
            torch.zeros(1, 1, dtype=torch.long),
            state,
            torch.tensor([0]),
        )
