"""The reference engine of `infernix bench decode`: Hugging Face `generate` over the same weights
(a `Qwen3ForCausalLM` or `LlamaForCausalLM` that adopts our state dict), unconstrained and with
xgrammar's HF logits processor."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import torch

from bench.models import prompt_texts
from bench.stats import ratio as _ratio
from bench.stats import schemas as _schemas
from bench.stats import summary as _summary
from services.worker.models import KVCache
from services.worker.runtime import ModelRuntime
from shared.generation import PromptInput

if TYPE_CHECKING:
    from bench.decode import DecodeBenchOptions

def hf_reference_model(runtime: ModelRuntime):
    """A transformers CausalLM that adopts the runtime's weights (no copy on the same device and
    dtype). Raises ValueError for a RoPE scaling the reference is not built for."""
    import transformers

    c = runtime.config
    if c.rope.rope_type != "default":
        raise ValueError(f"the reference supports default RoPE only, got {c.rope.rope_type!r}")
    kw = dict(vocab_size=c.vocab_size, hidden_size=c.hidden_size,
              intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
              num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
              head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
              max_position_embeddings=c.max_position_embeddings,
              tie_word_embeddings=c.tie_word_embeddings, attention_bias=c.qkv_bias,
              rope_parameters={"rope_type": "default", "rope_theta": c.rope.theta})
    if c.architecture == "qwen3":
        config, cls = transformers.Qwen3Config(**kw), transformers.Qwen3ForCausalLM
    elif c.architecture == "llama" and c.qkv_bias == c.o_bias:
        config, cls = (
            transformers.LlamaConfig(mlp_bias=c.mlp_bias, **kw),
            transformers.LlamaForCausalLM,
        )
    else:
        raise ValueError(f"no reference class for architecture {c.architecture!r}")
    config._attn_implementation = "sdpa"
    device, dtype = runtime.device, runtime.dtype
    with torch.device("meta"):
        model = cls(config)
    missing, unexpected = model.load_state_dict(
        runtime.model.state_dict(), strict=False, assign=True
    )
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise ValueError(f"weights do not match: missing {missing}, unexpected {unexpected}")
    with torch.device(device):  # its inverse frequencies are a non-persistent buffer
        model.model.rotary_emb = type(model.model.rotary_emb)(config=config)
    if c.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.generation_config = transformers.GenerationConfig()
    bad = [n for n, t in list(model.named_parameters()) + list(model.named_buffers()) if t.is_meta]
    if bad:
        raise ValueError(f"reference tensors left unset: {bad[:4]}")
    return model.to(dtype=dtype).eval().requires_grad_(False)


class _StepClock:
    """A logits processor recording when each step's logits are ready (after a device sync on
    CUDA); it also masks the never-generable ids, as our engine does, so outputs can agree."""

    def __init__(self, runtime: ModelRuntime) -> None:
        domain = runtime.domain
        never = sorted(set(range(len(domain.token_bytes), domain.size)) | set(domain.never_ids))
        self._never = (
            torch.tensor(never, dtype=torch.int64, device=runtime.device) if never else None
        )
        self._sync = runtime.device.type == "cuda"
        self.times: list[float] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self._sync:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores if self._never is None else scores.index_fill(1, self._never, float("-inf"))


@torch.inference_mode()
def _reference_round(model, runtime: ModelRuntime, prompts: list[str], max_tokens: int,
                     compiled: list | None, schemas: list[dict] | None) -> dict[str, Any]:
    import transformers
    import xgrammar.contrib.hf as xgr_hf

    dev, domain = runtime.device, runtime.domain
    ids = [list(runtime.prepare(PromptInput(text=p)).token_ids) for p in prompts]
    width = max(len(x) for x in ids)
    pad = min(domain.eos_ids)
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=dev)  # [B, L]
    attention = torch.tensor(
        [[0] * (width - len(x)) + [1] * len(x) for x in ids], device=dev
    )  # [B, L]
    clock = _StepClock(runtime)
    procs = [clock]
    if compiled is not None:
        procs.append(xgr_hf.LogitsProcessor([compiled[i % len(compiled)] for i in range(len(ids))]))
    gen = transformers.GenerationConfig(max_new_tokens=max_tokens, do_sample=False,
                                        eos_token_id=sorted(domain.eos_ids), pad_token_id=pad)
    start = time.perf_counter()
    out = model.generate(input_ids=input_ids, attention_mask=attention, generation_config=gen,
                         logits_processor=transformers.LogitsProcessorList(procs))
    if dev.type == "cuda":
        torch.cuda.synchronize()
    end = time.perf_counter()
    new = out[:, width:].tolist()  # [B, steps]
    tokens, texts = [], []
    for row in new:
        stop = next((k for k, t in enumerate(row) if t in domain.eos_ids), None)
        kept = row if stop is None else row[:stop + 1]
        tokens.append(len(kept))
        texts.append(b"".join(domain.token_bytes[t] for t in kept if t not in domain.eos_ids)
                     .decode("utf-8", "replace"))
    steps = len(new[0])
    tpot = [(end - clock.times[0]) / (steps - 1)] * len(ids) if steps >= 2 else []
    result = _summary(
        [clock.times[0] - start] * len(ids), tpot, tokens, end - start, texts, schemas
    )
    result["texts"] = texts
    return result


def _xgrammar_compiled(runtime: ModelRuntime, schemas: list[dict]) -> list:
    """The reference's own grammars: xgrammar's JSON Schema compiler over the model's vocabulary,
    as a Hugging Face user would build them (our engine may run another engine for JSON)."""
    import json

    import xgrammar as xgr

    compiler = xgr.GrammarCompiler(runtime.domain.tokenizer_info(), max_threads=1)
    return [compiler.compile_json_schema(json.dumps(s)) for s in schemas]


def bench_reference(runtime: ModelRuntime, opts: DecodeBenchOptions, log, partial) -> dict:
    model = hf_reference_model(runtime)
    schemas = _schemas()
    compiled = _xgrammar_compiled(runtime, schemas)
    n = opts.reference_max_tokens or opts.max_tokens
    rows = {"max_tokens": n, "warmup": "one untimed round of the same shape per mode",
            "logits_check": _logits_check(model, runtime, opts.prompt_tokens)}
    for b in opts.reference_batch_sizes:
        prompts = prompt_texts(runtime, b, opts.prompt_tokens)
        entry = {}
        for mode, comp, sch in (("unconstrained", None, None), ("constrained", compiled, schemas)):
            # One untimed round of the very shape first: a shorter one leaves the allocator's
            # growth of the generated length (and its first kernels) in the timed round, which
            # made the first timed mode look three times slower than a warm generate.
            _reference_round(model, runtime, prompts, n, comp, sch)
            entry[mode] = _reference_round(model, runtime, prompts, n, comp, sch)
            log(f"reference B={b} {mode}: tpot {entry[mode]['tpot_p50_ms']} ms")
        entry["tpot_ratio"] = _ratio(entry["constrained"]["tpot_p50_ms"],
                                     entry["unconstrained"]["tpot_p50_ms"])
        rows[b] = entry
        partial({"reference": rows})
    return rows


@torch.inference_mode()
def _logits_check(model, runtime: ModelRuntime, prompt_tokens: int) -> dict[str, Any]:
    """Last-position logits of one prompt through both models: relative L2 error (float64) and
    whether the argmax agrees (the reference must be the same function of the same weights)."""
    ids = list(
        runtime.prepare(PromptInput(text=prompt_texts(runtime, 1, prompt_tokens)[0])).token_ids
    )
    dev = runtime.device
    tokens = torch.tensor([ids], device=dev)  # [1, L]
    cache = KVCache.allocate(runtime.config, 1, len(ids), runtime.dtype, dev)
    ours = runtime.model(tokens, torch.arange(len(ids), device=dev)[None], cache,
                         torch.tensor([0], device=dev))[0, -1].double()  # [V]
    ref = model(input_ids=tokens).logits[0, -1].double()  # [V]
    return {"rel_l2_error": float((ours - ref).norm() / ref.norm()),
            "argmax_equal": bool(ours.argmax() == ref.argmax())}


