"""Time the bare Qwen3.5 model on CUDA: prefill and decode steps at several batch sizes, decode
through a CUDA graph and eagerly, beside the memory floor (weight bytes read per step / measured
device copy bandwidth). Writes JSON; no assertion about speed.

    python -m bench.qwen35_model --out qwen35_bench.json \
        [--batches 1,8,32,64] [--prompt 512] [--steps 64] [--verify 16] [--layers 32] \
        [--compare-unfused]

The model is `random_qwen35` (the 9B text shape, bf16; --layers shortens it for a smoke run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from bench.random_weights import random_qwen35


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth in bytes/s (read + write counted), best of `repeats`."""
    src = torch.empty(nbytes // 2, dtype=torch.int16, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return 2 * nbytes / best


def weight_bytes_per_step(model, batch: int) -> int:
    """Bytes of weights one decode step reads: every matrix once, the embedding's `batch` rows."""
    total = 0
    for name, p in model.named_parameters():
        if name.startswith("mtp."):
            continue
        if name.endswith("embed_tokens.weight") and model.lm_head is not None:
            total += batch * p.shape[1] * p.element_size()
        else:
            total += p.numel() * p.element_size()
    return total


def recurrent_state_bytes_per_step(model, batch: int) -> int:
    """Bytes of recurrent state one decode step reads and writes (a hybrid model's GDN state,
    float32, `batch` lanes; 0 for a model without one)."""
    config = model.config
    layers = getattr(config, "gdn_layers", ())
    if not layers:
        return 0
    return 2 * batch * len(layers) * config.linear_num_value_heads * config.linear_key_head_dim * \
        config.linear_value_head_dim * 4


def cuda_ms(fn, repeats: int) -> float:
    """Mean milliseconds of fn() over `repeats` calls, timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


@torch.inference_mode()
def bench_batch(
    model, batch: int, *, prompt: int, steps: int, verify: int, graphs: bool = True
) -> dict:
    """One batch size: a prefill of `prompt` tokens per row, `steps` decode steps with their
    commits (graph and eager), one verification forward of `verify` tokens plus its commit of a
    random accepted prefix."""
    device, dtype = model.rope_w.device, model.output_weight.dtype
    max_len = prompt + 3 * steps + verify + 16
    state = model.new_state(batch, max_len, dtype=dtype, device=device, verify_width=verify)
    lanes = torch.arange(batch, device=device)
    vocab = model.config.vocab_size
    tokens = torch.randint(0, vocab, (batch, prompt), device=device)
    positions = torch.arange(prompt, device=device)[None].expand(batch, -1)
    last = torch.full((batch, 1), prompt - 1, device=device)
    ones = torch.ones(batch, dtype=torch.long, device=device)
    model(
        tokens, positions, state, lanes, logit_index=last
    )  # compile and autotune kernels (fla-core)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    model(tokens, positions, state, lanes, logit_index=last)
    state.commit(lanes, ones * prompt)
    torch.cuda.synchronize()
    prefill_ms = (time.perf_counter() - t0) * 1e3
    tok = torch.randint(0, vocab, (batch, 1), device=device)
    pos = torch.full((batch, 1), prompt, device=device)

    def step():
        model(tok, pos, state, lanes)
        state.commit(lanes, ones)
        pos.add_(1)

    eager_ms = cuda_ms(step, max(steps // 4, 4))
    graph_ms = None
    if graphs:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                step()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        graph_ms = cuda_ms(graph.replay, steps)
    verify_ms = None
    if verify:
        drafts = torch.randint(0, vocab, (batch, verify), device=device)
        vpos = pos + torch.arange(verify, device=device)[None]
        accepted = torch.randint(1, verify + 1, (batch,), device=device)

        def verify_step():
            model(drafts, vpos, state, lanes)
            state.commit(lanes, accepted)

        verify_step()  # compile
        verify_ms = cuda_ms(verify_step, 4)
    best = graph_ms if graph_ms is not None else eager_ms
    return {"batch": batch, "prompt_tokens": prompt, "prefill_ms": prefill_ms,
            "prefill_tokens_per_s": batch * prompt / prefill_ms * 1e3, "decode_ms_eager": eager_ms,
            "decode_ms_graph": graph_ms, "decode_tokens_per_s": batch / best * 1e3,
            "verify_tokens": verify, "verify_and_commit_ms": verify_ms, "state_bytes": state.nbytes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="qwen35_bench.json")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--verify", type=int, default=16, help="verification width K+1 (0: none)")
    parser.add_argument("--layers", type=int, default=32, help="fewer layers for a smoke run")
    parser.add_argument("--no-graphs", action="store_true")
    parser.add_argument("--compare-unfused", action="store_true",
                        help="also time the op-by-op layer path (model.fused = False) per batch")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench.qwen35_model needs CUDA", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    layer_types = tuple(
        "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(args.layers)
    )
    model = random_qwen35(dtype=torch.bfloat16, device=device, layer_types=layer_types)
    bandwidth = copy_bandwidth(device)
    try:
        import fla  # noqa: F401
        fla_version = getattr(fla, "__version__", "installed")
    except ImportError:
        fla_version = None
    report = {
        "device": torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "fla_core": fla_version,
        "layers": args.layers,
        "copy_bandwidth_GBps": bandwidth / 1e9,
        "rows": [],
    }
    for batch in (int(b) for b in args.batches.split(",")):
        unfused = None
        if args.compare_unfused:
            model.fused = False
            unfused = bench_batch(model, batch, prompt=args.prompt, steps=args.steps,
                                  verify=args.verify, graphs=not args.no_graphs)
            model.fused = True
        row = bench_batch(model, batch, prompt=args.prompt, steps=args.steps, verify=args.verify,
                          graphs=not args.no_graphs)
        if unfused is not None:
            row["unfused"] = unfused
            before = unfused["decode_ms_graph"] or unfused["decode_ms_eager"]
            row["decode_speedup_fused_over_unfused"] = before / (
                row["decode_ms_graph"] or row["decode_ms_eager"]
            )
        weights = weight_bytes_per_step(model, batch)
        gdn_state = recurrent_state_bytes_per_step(model, batch)
        row.update(weight_bytes=weights, floor_ms=weights / bandwidth * 1e3,
                   floor_with_gdn_state_ms=(weights + gdn_state) / bandwidth * 1e3)
        best = row["decode_ms_graph"] or row["decode_ms_eager"]
        row["decode_over_floor"] = best / row["floor_ms"]
        report["rows"].append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
