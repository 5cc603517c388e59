"""Our dense decoder against Hugging Face `transformers` on small random Qwen3, Qwen2 and Llama
checkpoints written with `save_pretrained` and read back by `load_hf_model`.

The oracle runs each row's whole token sequence through the transformers model without any cache
(eager attention); ours runs the same tokens through the serving path: chunked prefill into the
lane KV cache, a chunk mixed with a decode row, then batched decode of two rows at different
lengths. The helpers here are shared with test_worker_models_smollm2.py.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

from services.worker.models import KVCache, ModelConfig, ModelConfigError, load_hf_model


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """These small forwards run fastest on one thread; on the shared 2-core machine the second
    OpenMP thread mostly spins (measured 8x the CPU time under load). Restored afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Tokens each row feeds per step: prefill chunk, a chunk beside a decode row, then batched decode.
SCHEDULE = ((6, 4), (3, 1), (1, 1), (1, 1), (1, 1), (1, 1))
LANES = (2, 0)  # rows live in lanes 2 and 0 of a 3-lane cache
PAD = 0


def run_serving_path(model, config: ModelConfig, sequences: list[list[int]], *, dtype=torch.float32,
                     device="cpu", schedule=SCHEDULE, lanes=LANES, num_lanes: int = 3,
                     max_len: int = 32) -> list[torch.Tensor]:
    """Feed `sequences` through our model by `schedule`; returns per row the logits [n, V] (float32,
    CPU) of every real token fed, in order."""
    cache = KVCache.allocate(config, num_lanes, max_len, dtype, device)
    fed = [0] * len(sequences)
    out: list[list[torch.Tensor]] = [[] for _ in sequences]
    lane_t = torch.tensor(lanes, device=device)
    for counts in schedule:
        T = max(counts)
        tokens = torch.full((len(sequences), T), PAD, dtype=torch.long)
        positions = torch.empty((len(sequences), T), dtype=torch.long)
        for b, (seq, n) in enumerate(zip(sequences, counts)):
            tokens[b, :n] = torch.tensor(seq[fed[b]:fed[b] + n])
            positions[b] = torch.arange(fed[b], fed[b] + T)  # padding continues the positions
        with torch.no_grad():
            logits = model(tokens.to(device), positions.to(device), cache, lane_t)  # [B, T, V]
        for b, n in enumerate(counts):
            out[b].append(logits[b, :n].float().cpu())
            fed[b] += n
    return [torch.cat(rows) for rows in out]


def reference_logits(
    hf_model, sequences: list[list[int]], lengths: list[int]
) -> list[torch.Tensor]:
    """transformers' logits [n, V] (float32) for the first n tokens of each sequence, no cache."""
    result = []
    with torch.no_grad():
        for seq, n in zip(sequences, lengths):
            ids = torch.tensor([seq[:n]], device=hf_model.device)
            result.append(hf_model(input_ids=ids, use_cache=False).logits[0].float().cpu())
    return result


def assert_logits_close(ours: list[torch.Tensor], ref: list[torch.Tensor], rel: float) -> None:
    """Every logit within rel * (largest reference magnitude) of the reference."""
    for b, (o, r) in enumerate(zip(ours, ref)):
        assert o.shape == r.shape, (b, o.shape, r.shape)
        scale = r.abs().max().item()
        err = (o - r).abs().max().item()
        assert err <= rel * scale, (
            f"row {b}: max |ours - ref| = {err:.3g}, logits scale {scale:.3g}"
        )


def randomize_(hf_model, seed: int) -> None:
    """Weights large enough that attention is far from uniform and logits are O(1..10)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in hf_model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.5 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5 * 1.5)


SMALL = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
)


def make_checkpoint(tmp_path, family: str, seed: int = 0):
    """A random transformers model of `family` saved with save_pretrained; returns (dir, model)."""
    import transformers

    if family == "qwen3":
        cfg = transformers.Qwen3Config(
            **SMALL,
            head_dim=16,
            tie_word_embeddings=True,
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 1000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        )
        cls = transformers.Qwen3ForCausalLM
    elif family == "qwen2":
        cfg = transformers.Qwen2Config(**SMALL, rope_parameters={
            "rope_type": "linear", "rope_theta": 500.0, "factor": 2.0})
        cls = transformers.Qwen2ForCausalLM
    else:
        cfg = transformers.LlamaConfig(
            **SMALL,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        )
        cls = transformers.LlamaForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    hf = cls(cfg).eval()
    randomize_(hf, seed)
    hf.save_pretrained(str(tmp_path))
    return str(tmp_path), hf


def random_sequences(vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    lengths = [sum(c[b] for c in SCHEDULE) for b in range(2)]
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_logits_match_transformers(tmp_path, family):
    """DESIGN 'Models and token domain': Llama-family dense models (Llama, Qwen2, Qwen3) load by
    their Hugging Face names; "transformers is used in tests as an independent oracle (same weights,
    same logits within tolerance)". Prefill chunks, a chunk beside a decode row, and batched decode
    of rows at different lengths through the lane KV cache must all match the cache-free
    reference."""
    path, hf = make_checkpoint(tmp_path, family)
    model, config = load_hf_model(path)
    assert config.architecture == family and model.source_path == path
    sequences = random_sequences(config.vocab_size, seed=1)
    ours = run_serving_path(model, config, sequences)
    ref = reference_logits(hf, sequences, [len(o) for o in ours])
    assert min(r.abs().max().item() for r in ref) > 1.0  # a test that RoPE or bias errors can fail
    assert_logits_close(ours, ref, rel=1e-4)


def test_config_families(tmp_path):
    """The families' differences (DESIGN: "attention bias (Qwen2 has q/k/v bias), optional q/k norm
    (Qwen3), tied embeddings") come from config.json, with the RoPE scaling parsed as written."""
    path, _ = make_checkpoint(tmp_path, "qwen3")
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    q3 = ModelConfig.from_hf(raw)
    assert (q3.qk_norm, q3.qkv_bias, q3.tie_word_embeddings, q3.head_dim) == (True, False, True, 16)
    assert (q3.rope.rope_type, q3.rope.factor, q3.rope.original_max_position_embeddings) == (
        "yarn",
        4.0,
        64,
    )
    q2 = ModelConfig.from_hf({**raw, "model_type": "qwen2", "attention_bias": False})
    assert (q2.qk_norm, q2.qkv_bias, q2.o_bias) == (False, True, False)


def test_transformers4_rope_spelling():
    """transformers 4 wrote `rope_scaling` with the legacy key "type" and a top-level rope_theta."""
    raw = {
        "model_type": "llama",
        **SMALL,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    }
    cfg = ModelConfig.from_hf(raw)
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.rope.original_max_position_embeddings) == (
        "llama3",
        500000.0,
        8192,
    )


@pytest.mark.parametrize(
    "change, field",
    [
        (
            {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}},
            "rope_parameters.rope_type",
        ),
        (
            {"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
            "rope_parameters.rope_type",
        ),
        ({"rope_scaling": {"type": "mystery"}}, "rope_scaling.rope_type"),
        ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4}}, "rope_parameters.factor"),
        ({"model_type": "mistral"}, "model_type"),
        ({"num_key_value_heads": 3}, "num_key_value_heads"),
        ({"use_sliding_window": True}, "use_sliding_window"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"hidden_size": "64"}, "hidden_size"),
    ],
)
def test_config_rejects_unsupported(change, field):
    """Unknown RoPE types and unsupported features fail at load with an error naming the key
    (STYLE: errors name the field and give expected and actual values)."""
    raw = {"model_type": "qwen3", **SMALL, **change}
    with pytest.raises(ModelConfigError) as info:
        ModelConfig.from_hf(raw)
    assert info.value.field == field


def test_load_rejects_mismatched_weights(tmp_path):
    """A checkpoint whose tensors do not fit its config.json fails with the tensor named."""
    path, _ = make_checkpoint(tmp_path, "qwen2")
    with open(os.path.join(path, "config.json")) as f:
        raw = json.load(f)
    raw["intermediate_size"] = 80
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(raw, f)
    with pytest.raises(ModelConfigError, match="mlp"):
        load_hf_model(path)


def test_kv_cache_budget():
    """Worker: "a fixed number of resident lanes (max batch B), each with its KV cache region";
    the budget helper counts 2 (k, v) x layers x kv heads x head_dim x element size per token, and
    the paged pool (models/kv_cache.py) takes whole blocks of 16 positions per lane, plus the trash
    block and 4 table bytes per lane block."""
    cfg = ModelConfig.from_hf({"model_type": "llama", **SMALL})
    per_token = 2 * 2 * 2 * 16 * 2  # k/v, layers, kv heads, head_dim, bf16 bytes
    assert KVCache.bytes_per_token(cfg, torch.bfloat16) == per_token
    two_blocks = (1 + 2) * 16 * per_token + 2 * 4  # trash + 2 blocks + 2 table entries, one lane
    assert KVCache.positions_for_budget(cfg, 1, two_blocks, torch.bfloat16) == 32
    assert KVCache.positions_for_budget(cfg, 1, two_blocks - 1, torch.bfloat16) == 16
    cache = KVCache.from_budget(cfg, lanes=3, budget_bytes=200 * per_token, dtype=torch.bfloat16)
    assert (cache.lanes, cache.max_len, cache.num_blocks) == (3, 48, 1 + 3 * 3)
    assert cache.nbytes <= 200 * per_token
    assert cache.keys(1).shape == (10, 16, 2, 16) and cache.block_table.shape == (3, 3)
    assert KVCache.from_budget(cfg, lanes=1, budget_bytes=10**9, dtype=torch.bfloat16).max_len == 64
    with pytest.raises(ValueError):
        KVCache.from_budget(cfg, lanes=4, budget_bytes=3 * per_token, dtype=torch.bfloat16)


def test_logit_index_selects_columns(tmp_path):
    """forward's logit_index returns exactly the selected columns of the full logits (each row's
    last real token of a padded chunk)."""
    path, _ = make_checkpoint(tmp_path, "llama")
    model, config = load_hf_model(path)
    tokens = torch.randint(1, config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(3))
    positions = torch.arange(5).repeat(2, 1)
    lanes = torch.tensor([1, 0])
    with torch.no_grad():
        full = model(tokens, positions, KVCache.allocate(config, 2, 8), lanes)  # [2, 5, V]
        last = model(tokens, positions, KVCache.allocate(config, 2, 8), lanes,
                     logit_index=torch.tensor([[4], [2]]))  # [2, 1, V]
    torch.testing.assert_close(
        last[:, 0], torch.stack([full[0, 4], full[1, 2]]), rtol=1e-5, atol=1e-5
    )


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_logits_match_transformers_bf16_cuda(tmp_path, family):
    """The same serving-path comparison in bf16 on CUDA against the float32 transformers oracle.
    Tolerance: no more than twice the error of transformers' own bf16 CUDA run of the same weights
    (and at most 5% of the logit scale)."""
    path, hf = make_checkpoint(tmp_path, family)
    model, config = load_hf_model(path, dtype=torch.bfloat16, device="cuda")
    sequences = random_sequences(config.vocab_size, seed=1)
    ours = run_serving_path(model, config, sequences, dtype=torch.bfloat16, device="cuda")
    lengths = [len(o) for o in ours]
    ref = reference_logits(hf, sequences, lengths)
    hf_bf16 = reference_logits(hf.to(device="cuda", dtype=torch.bfloat16), sequences, lengths)
    for o, r, h in zip(ours, ref, hf_bf16):
        err, hf_err, scale = (
            (o - r).abs().max().item(),
            (h.cpu() - r).abs().max().item(),
            r.abs().max().item(),
        )
        assert err <= min(2 * hf_err + 1e-3 * scale, 5e-2 * scale), (err, hf_err, scale)


@pytest.mark.parametrize(
    "params",
    [
        {"rope_type": "default", "rope_theta": 1e6},
        {"rope_type": "linear", "rope_theta": 1e4, "factor": 3.0},
        {
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 32.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e6,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "beta_fast": 16.0,
            "truncate": False,
        },
        {
            "rope_type": "yarn",
            "rope_theta": 1e4,
            "factor": 2.0,
            "original_max_position_embeddings": 2048,
            "attention_factor": 0.9,
        },
    ],
)
def test_rope_frequencies_match_transformers(params):
    """RoPE "with the config's scaling" (default, linear, llama3, yarn): our inverse frequencies and
    cos/sin scale equal transformers' own RoPE initialisers for the same rope_parameters."""
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    from services.worker.models.rope import inverse_frequencies

    raw = {**SMALL, "hidden_size": 512, "num_attention_heads": 4, "max_position_embeddings": 131072,
           "rope_parameters": dict(params)}
    ours, scale = inverse_frequencies(ModelConfig.from_hf({"model_type": "llama", **raw}).rope, 128)
    hf_cfg = transformers.LlamaConfig(**raw)
    if params["rope_type"] == "default":
        ref, ref_scale = LlamaRotaryEmbedding.compute_default_rope_parameters(hf_cfg)
    else:
        ref, ref_scale = ROPE_INIT_FUNCTIONS[params["rope_type"]](hf_cfg)
    torch.testing.assert_close(ours, ref.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale, rel=1e-12)
