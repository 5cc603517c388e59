"""The arguments of `infernix bench decode` (imports nothing heavy: `--help` answers at once)."""

from __future__ import annotations

import argparse

MODELS = ("smollm2", "qwen3-8b-random")


def _run(args: argparse.Namespace) -> int:
    from services.worker.bench.decode import run

    return run(args)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="decode TPOT with and without a JSON Schema constraint",
                       description="Our engine beside Hugging Face generate (+ xgrammar) on the "
                       "same weights: TTFT, TPOT, throughput, constrained and not, as JSON.")
    p.add_argument("--model", choices=MODELS, default="smollm2", help="default: smollm2")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--batch-sizes", type=int, nargs="+", metavar="B",
                   help="default: 1 8 32 (CPU), 1 8 32 64 (CUDA)")
    p.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default: 32)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="prompt tokens per request (default: 64)")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also time Hugging Face generate (+ xgrammar's HF logits processor; default: on)")
    p.add_argument("--reference-batch-sizes", type=int, nargs="+", metavar="B",
                   help="default: 1 (CPU), 1 8 (CUDA)")
    p.add_argument("--reference-max-tokens", type=int, metavar="N", help="default: --max-tokens")
    p.add_argument("--compare-unfused", action="store_true",
                   help="first run the engine on the op-by-op model path with the general greedy "
                   "sampler (the before), then the fused path, in one run")
    p.add_argument("--breakdown", action="store_true",
                   help="time forward and sample per batch size (CUDA events; the wall clock on "
                   "the CPU) beside the memory floor; host share and idle device from the TPOT")
    p.add_argument("--no-cuda-graphs", action="store_true", help="our engine without decode graphs")
    p.add_argument("--log-level", default="WARNING", help="engine log level (default: WARNING)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run)
