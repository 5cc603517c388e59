"""`infernix bench decode`: what a JSON Schema constraint costs per output token, as JSON.

For each batch size B, one engine (`max_batch` = the largest B, CUDA graphs on CUDA) runs B
concurrent greedy requests of a fixed `max_tokens`, first unconstrained, then each with a typical
JSON Schema (`services.grammar.bench.SCHEMAS`, request i gets schema i mod 2). Per mode it reports
time to first token (p50 over requests), time per output token (p50 over requests of
decode time / (tokens - 1)), throughput (all output tokens / wall time of the round) and the
constraint report's CPU seconds (mask fills, accepts), plus constrained / unconstrained TPOT.
The reference engine is Hugging Face `generate` over the same weights (a `Qwen3ForCausalLM` or
`LlamaForCausalLM` that adopts our state dict), unconstrained and with xgrammar's HF logits
processor. Targets (issue 3, measured, never asserted): constrained TPOT within 3% of
unconstrained at every B on the H200; ours >= 3x faster per token than the reference at B = 1;
CPU mask work hidden at B = 1.

Models: `smollm2` (the built-in default) and `qwen3-8b-random`, a random-weight bf16 model of
Qwen3-8B's shape over the Qwen3.5 vocabulary (structure only: timings, never quality).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import platform
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch

from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.models import DenseDecoder, KVCache, ModelConfig, RopeConfig
from services.worker.runtime import ModelRuntime, load_runtime
from shared.contract import OutputConstraint
from shared.frontends.token_domain import TokenDomain
from shared.generation import (
    Finished,
    GenerateRequest,
    PromptInput,
    RequestOptions,
    SamplingParams,
)

MODELS = ("smollm2", "qwen3-8b-random")
# Qwen3-8B's shape (config.json of Qwen/Qwen3-8B); the vocabulary is the domain's.
QWEN3_8B_SHAPE = {"hidden_size": 4096, "intermediate_size": 12288, "num_layers": 36,
                  "num_heads": 32, "num_kv_heads": 8, "head_dim": 128}
_SENTENCE = "The quick brown fox {k} jumps over the lazy dog while the band plays on. "


@dataclass(frozen=True)
class DecodeBenchOptions:
    batch_sizes: tuple[int, ...] = (1, 8)  # concurrent requests per round, each >= 1
    max_tokens: int = 32  # output tokens per request, >= 2 (TPOT needs two tokens)
    prompt_tokens: int = 64  # approximate prompt length per request, >= 1
    reference: bool = True  # also time Hugging Face generate
    reference_batch_sizes: tuple[int, ...] = (1,)  # batch sizes the reference runs, each >= 1
    reference_max_tokens: int | None = None  # None: max_tokens
    cuda_graphs: bool = True  # our engine's decode graphs (CUDA only)
    warmup_tokens: int = 4  # output tokens of the warm-up rounds, >= 2

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "reference_batch_sizes"):
            sizes = getattr(self, name)
            if not sizes or any(b < 1 for b in sizes):
                raise ValueError(f"DecodeBenchOptions.{name} must be non-empty sizes >= 1, got {sizes}")
        for name, low in (("max_tokens", 2), ("prompt_tokens", 1), ("warmup_tokens", 2)):
            if getattr(self, name) < low:
                raise ValueError(f"DecodeBenchOptions.{name} must be >= {low}, got {getattr(self, name)}")
        if self.reference_max_tokens is not None and self.reference_max_tokens < 2:
            raise ValueError(f"DecodeBenchOptions.reference_max_tokens must be >= 2, got "
                             f"{self.reference_max_tokens}")


class _TiktokenAdapter:
    def __init__(self, tok) -> None:
        self._tok = tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text))


@torch.no_grad()
def random_qwen3_runtime(domain: TokenDomain, tokenizer, *, name: str = "qwen3-8b-random",
                         shape: dict[str, int] = QWEN3_8B_SHAPE, max_position_embeddings: int = 4096,
                         seed: int = 0, dtype: torch.dtype = torch.bfloat16,
                         device: str | torch.device = "cuda") -> ModelRuntime:
    """A random-weight Qwen3 model (q/k RMSNorm, RoPE theta 1e6, untied head) of `shape` (default
    Qwen3-8B's) over `domain`, built directly on `device`. Linear weights ~ N(0, 1/fan_in),
    embeddings ~ N(0, 1), norms 1, drawn from `seed` (default 0)."""
    config = ModelConfig(architecture="qwen3", vocab_size=domain.size, rms_norm_eps=1e-6,
                         max_position_embeddings=max_position_embeddings,
                         rope=RopeConfig(theta=1e6), qk_norm=True, **shape)
    decoder = DenseDecoder(config, dtype=dtype, device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    for pname, p in decoder.named_parameters():
        if pname.endswith("norm.weight"):
            p.fill_(1.0)
        else:
            std = 1.0 if pname.endswith("embed_tokens.weight") else p.shape[-1] ** -0.5
            p.normal_(0.0, std, generator=gen)
    decoder = decoder.eval().requires_grad_(False)
    return ModelRuntime(name, decoder, config, domain, tokenizer)


def build_runtime(model: str, device: str) -> ModelRuntime:
    """The benchmark's runtime: bf16 on CUDA, float32 on the CPU. Raises ValueError for an
    unknown model name."""
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    if model == "smollm2":
        return load_runtime("smollm2", device=device, dtype=dtype)
    if model == "qwen3-8b-random":
        from shared.frontends import get_domain
        from shared.frontends.qwen35 import qwen35_tokenizer

        return random_qwen3_runtime(get_domain("qwen3.5"), _TiktokenAdapter(qwen35_tokenizer()),
                                    dtype=dtype, device=device)
    raise ValueError(f"unknown model {model!r}; expected one of {', '.join(MODELS)}")


def prompt_texts(runtime: ModelRuntime, count: int, tokens: int) -> list[str]:
    """`count` distinct raw-text prompts of at least `tokens` tokens (a few more at most)."""
    out = []
    for i in range(count):
        text, k = f"Request {i}. ", 0
        while len(runtime.tokenizer.encode(text)) < tokens:
            text += _SENTENCE.format(k=k)
            k += 1
        while k and len(runtime.tokenizer.encode(text[:-1])) >= tokens:
            text = text[:-1]
        out.append(text)
    return out


def _schemas() -> list[dict]:
    from services.grammar.bench import SCHEMAS

    return [schema for schema, _ in SCHEMAS]


def _p50(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _valid(text: str, schema: dict) -> bool:
    import jsonschema

    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def _summary(ttft: list[float], tpot: list[float], tokens: list[int], wall: float,
             texts: list[str], schemas: list[dict] | None) -> dict[str, Any]:
    out = {"requests": len(tokens), "output_tokens": sum(tokens), "wall_s": round(wall, 4),
           "ttft_p50_ms": _ms(_p50(ttft)), "tpot_p50_ms": _ms(_p50(tpot)),
           "throughput_tok_s": round(sum(tokens) / wall, 2),
           "tokens_per_request": {"min": min(tokens), "max": max(tokens)}}
    if schemas is not None:
        out["valid_json"] = sum(_valid(t, schemas[i % len(schemas)]) for i, t in enumerate(texts))
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


# ---------------------------------------------------------------- our engine


async def _collect(client, request: GenerateRequest) -> Finished:
    async for event in client.generate(request):
        if isinstance(event, Finished):
            if event.error is not None:
                raise RuntimeError(f"request {request.request_id} failed: {event.error}")
            return event
    raise RuntimeError(f"request {request.request_id} ended without Finished")


async def _engine_round(client, runtime: ModelRuntime, prompts: list[str], max_tokens: int,
                        schemas: list[dict] | None, tag: str) -> dict[str, Any]:
    sampling = SamplingParams(temperature=0.0)
    requests = [GenerateRequest(
        f"{tag}-{i}", PromptInput(text=p), RequestOptions(
            max_tokens=max_tokens, sampling=sampling,
            constraint=OutputConstraint.json_schema(schemas[i % len(schemas)]) if schemas else None),
        model=runtime.name) for i, p in enumerate(prompts)]
    start = time.perf_counter()
    finished = await asyncio.gather(*(_collect(client, r) for r in requests))
    wall = time.perf_counter() - start
    tokens = [f.usage.completion_tokens for f in finished]
    tpot = [f.timings["decode"] / (n - 1) for f, n in zip(finished, tokens) if n >= 2]
    out = _summary([f.timings["ttft"] for f in finished], tpot, tokens, wall,
                   [f.content for f in finished], schemas)
    out["texts"] = [f.content for f in finished]
    if schemas:
        reports = [f.constraint or {} for f in finished]
        mask_s = sum(r.get("mask_seconds", 0.0) for r in reports)
        positions = sum(r.get("mask_positions", 0) for r in reports)
        out["constraint_cpu"] = {
            "mask_seconds": round(mask_s, 6),
            "accept_seconds": round(sum(r.get("accept_seconds", 0.0) for r in reports), 6),
            "mask_positions": positions,
            "mask_us_per_position": round(1e6 * mask_s / positions, 2) if positions else None,
        }
    return out


async def _bench_engine(runtime: ModelRuntime, opts: DecodeBenchOptions, log,
                        partial) -> tuple[dict, list]:
    schemas = _schemas()
    max_len = opts.prompt_tokens + max(opts.max_tokens, opts.warmup_tokens) + 32
    config = EngineConfig(max_batch=max(opts.batch_sizes), max_len=max_len,
                          prefill_chunk=max(512, opts.prompt_tokens + 32),
                          cuda_graphs=opts.cuda_graphs)
    client = open_in_process(runtime, config)
    compiled = []
    try:
        for schema in schemas:  # compile outside every timed round; keep them for the reference
            result = await client.engine.grammar.compile(OutputConstraint.json_schema(schema),
                                                         model=runtime.name)
            compiled.append(result.grammar)
        rows = {}
        for b in opts.batch_sizes:
            prompts = prompt_texts(runtime, b, opts.prompt_tokens)
            for mode, sch in (("unconstrained", None), ("constrained", schemas)):
                await _engine_round(client, runtime, prompts, opts.warmup_tokens, sch, f"w{b}{mode}")
            entry = {}
            for mode, sch in (("unconstrained", None), ("constrained", schemas)):
                entry[mode] = await _engine_round(client, runtime, prompts, opts.max_tokens, sch,
                                                  f"m{b}{mode}")
                log(f"engine B={b} {mode}: tpot {entry[mode]['tpot_p50_ms']} ms, "
                    f"{entry[mode]['throughput_tok_s']} tok/s")
            entry["tpot_ratio"] = _ratio(entry["constrained"]["tpot_p50_ms"],
                                         entry["unconstrained"]["tpot_p50_ms"])
            rows[b] = entry
            partial({"engine": rows})
        return rows, compiled
    finally:
        await client.aclose()


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 4) if a is not None and b else None


# ---------------------------------------------------------------- Hugging Face reference


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
        config, cls = transformers.LlamaConfig(mlp_bias=c.mlp_bias, **kw), transformers.LlamaForCausalLM
    else:
        raise ValueError(f"no reference class for architecture {c.architecture!r}")
    config._attn_implementation = "sdpa"
    device, dtype = runtime.device, runtime.dtype
    with torch.device("meta"):
        model = cls(config)
    missing, unexpected = model.load_state_dict(runtime.model.state_dict(), strict=False, assign=True)
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
        self._never = torch.tensor(never, dtype=torch.int64, device=runtime.device) if never else None
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
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=dev)  # [B, L]
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
    result = _summary([clock.times[0] - start] * len(ids), tpot, tokens, end - start, texts, schemas)
    result["texts"] = texts
    return result


def _bench_reference(runtime: ModelRuntime, opts: DecodeBenchOptions, compiled: list, log,
                     partial) -> dict:
    model = hf_reference_model(runtime)
    schemas = _schemas()
    n = opts.reference_max_tokens or opts.max_tokens
    rows = {"max_tokens": n, "logits_check": _logits_check(model, runtime, opts.prompt_tokens)}
    for b in opts.reference_batch_sizes:
        prompts = prompt_texts(runtime, b, opts.prompt_tokens)
        _reference_round(model, runtime, prompts, opts.warmup_tokens, None, None)
        _reference_round(model, runtime, prompts, opts.warmup_tokens, compiled, schemas)
        entry = {}
        for mode, comp, sch in (("unconstrained", None, None), ("constrained", compiled, schemas)):
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
    ids = list(runtime.prepare(PromptInput(text=prompt_texts(runtime, 1, prompt_tokens)[0])).token_ids)
    dev = runtime.device
    tokens = torch.tensor([ids], device=dev)  # [1, L]
    cache = KVCache.allocate(runtime.config, 1, len(ids), runtime.dtype, dev)
    ours = runtime.model(tokens, torch.arange(len(ids), device=dev)[None], cache,
                         torch.tensor([0], device=dev))[0, -1].double()  # [V]
    ref = model(input_ids=tokens).logits[0, -1].double()  # [V]
    return {"rel_l2_error": float((ours - ref).norm() / ref.norm()),
            "argmax_equal": bool(ours.argmax() == ref.argmax())}


# ---------------------------------------------------------------- report


def _agreement(ours: dict, ref: dict) -> float:
    pairs = list(zip(ours["texts"], ref["texts"]))
    return round(sum(a == b for a, b in pairs) / len(pairs), 3)


def bench_decode(runtime: ModelRuntime, opts: DecodeBenchOptions, log=lambda line: None,
                 partial=lambda results: None) -> dict:
    """Run the whole benchmark on `runtime`; returns the report's `results` and `targets`.
    `log(line)` gets progress lines; `partial(results)` the raw results measured so far after
    each batch size (so an interrupted run still leaves numbers)."""
    engine, compiled = asyncio.run(_bench_engine(runtime, opts, log, partial))
    done = {"engine": engine}
    reference = None
    if opts.reference:
        reference = _bench_reference(runtime, opts, compiled, log,
                                     lambda rows: partial({**done, **rows}))
    rows = []
    for b in opts.batch_sizes:
        row = {"batch_size": b, "engine": engine[b], "reference": None}
        if reference is not None and b in reference:
            ref = reference[b]
            row["reference"] = ref
            row["speedup_tpot_unconstrained"] = _ratio(ref["unconstrained"]["tpot_p50_ms"],
                                                       engine[b]["unconstrained"]["tpot_p50_ms"])
            row["speedup_tpot_constrained"] = _ratio(ref["constrained"]["tpot_p50_ms"],
                                                     engine[b]["constrained"]["tpot_p50_ms"])
            row["outputs_equal_fraction"] = {m: _agreement(engine[b][m], ref[m])
                                             for m in ("unconstrained", "constrained")}
        rows.append(row)
    first = rows[0] if rows[0]["batch_size"] == 1 else None
    targets = {
        "constrained_tpot_within_3pct": {r["batch_size"]: r["engine"]["tpot_ratio"] is not None
                                         and r["engine"]["tpot_ratio"] <= 1.03 for r in rows},
        "speedup_vs_reference_at_b1_ge_3x": None if first is None or first["reference"] is None
        else first["speedup_tpot_unconstrained"] >= 3.0,
        "mask_hidden_at_b1": None if first is None else first["engine"]["tpot_ratio"] <= 1.03,
    }
    return {"results": rows, "reference": None if reference is None else {
        "max_tokens": reference["max_tokens"], "logits_check": reference["logits_check"]},
            "targets": targets}


def _machine(device: str) -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "python": sys.version.split()[0], "cpu_count": __import__("os").cpu_count(),
            "torch": torch.__version__, "triton": version("triton"),
            "transformers": version("transformers"), "xgrammar": version("xgrammar"),
            "torch_threads": torch.get_num_threads()}
    if device.startswith("cuda"):
        info["gpu"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    return info


def run(args: argparse.Namespace) -> int:
    cuda = args.device.startswith("cuda")
    opts = DecodeBenchOptions(
        batch_sizes=tuple(args.batch_sizes or ((1, 8, 32, 64) if cuda else (1, 8, 32))),
        max_tokens=args.max_tokens, prompt_tokens=args.prompt_tokens, reference=args.reference,
        reference_batch_sizes=tuple(args.reference_batch_sizes or ((1, 8) if cuda else (1,))),
        reference_max_tokens=args.reference_max_tokens, cuda_graphs=not args.no_cuda_graphs)

    def log(line: str) -> None:
        print(f"[bench decode] {line}", file=sys.stderr, flush=True)

    from shared.logging import configure_logging

    configure_logging(args.log_level)  # per-request logs would flood the timing rounds

    started = time.perf_counter()
    runtime = build_runtime(args.model, args.device)
    log(f"runtime {args.model} on {args.device} ready in {time.perf_counter() - started:.1f} s")
    report: dict[str, Any] = {
        "bench": "decode", "command": "infernix " + shlex.join(sys.argv[1:]),
        "machine": _machine(args.device), "model": args.model, "device": args.device,
        "dtype": str(runtime.dtype).removeprefix("torch."),
        "options": {"batch_sizes": list(opts.batch_sizes), "max_tokens": opts.max_tokens,
                    "prompt_tokens": opts.prompt_tokens, "reference": opts.reference,
                    "reference_batch_sizes": list(opts.reference_batch_sizes),
                    "cuda_graphs": opts.cuda_graphs, "greedy": True},
    }

    def partial(results: dict) -> None:
        if args.out:
            with open(args.out + ".partial", "w", encoding="utf-8") as f:
                json.dump({**report, "partial": results}, f, indent=2, default=str)

    report.update(bench_decode(runtime, opts, log, partial))
    report["total_s"] = round(time.perf_counter() - started, 1)
    write_report(report, args.out)
    return 0


def write_report(report: dict, out: str | None) -> None:
    """Print the report as JSON and also write it to `out` when given."""
    text = json.dumps(report, indent=2, default=str)
    if out:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="decode TPOT with and without a JSON Schema constraint")
    p.add_argument("--model", choices=MODELS, default="smollm2")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--batch-sizes", type=int, nargs="+",
                   help="default: 1 8 32 (CPU), 1 8 32 64 (CUDA)")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request")
    p.add_argument("--prompt-tokens", type=int, default=64, help="prompt tokens per request")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also time Hugging Face generate (+ xgrammar's HF logits processor)")
    p.add_argument("--reference-batch-sizes", type=int, nargs="+",
                   help="default: 1 (CPU), 1 8 (CUDA)")
    p.add_argument("--reference-max-tokens", type=int, help="default: --max-tokens")
    p.add_argument("--no-cuda-graphs", action="store_true", help="our engine without decode graphs")
    p.add_argument("--log-level", default="WARNING", help="engine log level (default WARNING)")
    p.add_argument("--out", help="also write the JSON here")
    p.set_defaults(func=run)
