"""The arguments of every `infernix bench ...` command (imports nothing heavy: `--help` answers
at once); services/cli.py adds them with `add_parsers`, its one import of bench/."""

from __future__ import annotations

import argparse

from shared.frontends import MODELS as GRAMMAR_MODELS

MODELS = ("smollm2", "qwen3-8b-random", "qwen35-9b-random")


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Every bench command under `infernix bench`."""
    add_bench_parser(sub)
    add_store_bench_parser(sub)
    add_bounded_strings_parser(sub)
    add_parser(sub)
    add_spec_parser(sub)
    add_prefix_parser(sub)
    # bench/serve.py imports only aiohttp at run time: its parser is cheap to build
    from bench.serve import add_parser as add_serve_parser

    add_serve_parser(sub)
    from bench.coldstart import add_parser as add_coldstart_parser  # likewise: no torch

    add_coldstart_parser(sub)


def _run(args: argparse.Namespace) -> int:
    from bench.decode import run

    return run(args)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("decode", help="decode TPOT with and without a JSON Schema constraint",
                       description="Our engine beside Hugging Face generate (+ xgrammar) on the "
                       "same weights: TTFT, TPOT, throughput, constrained and not, as JSON.")
    p.add_argument("--model", choices=MODELS, default="smollm2", help="default: smollm2")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--batch-sizes", type=int, nargs="+", metavar="B",
                   help="default: 1 8 32 (CPU), 1 8 32 64 (CUDA)")
    p.add_argument("--max-tokens", type=int, default=32,
                   help="output tokens per request (default: 32)")
    p.add_argument("--prompt-tokens", type=int, default=64,
                   help="prompt tokens per request (default: 64)")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also time Hugging Face generate (+ xgrammar's HF logits processor; "
                   "default: on)")
    p.add_argument("--reference-batch-sizes", type=int, nargs="+", metavar="B",
                   help="default: 1 (CPU), 1 8 (CUDA)")
    p.add_argument("--reference-max-tokens", type=int, metavar="N", help="default: --max-tokens")
    p.add_argument("--compare-unfused", action="store_true",
                   help="first run the engine on the op-by-op model path (the reference the fused "
                   "path is tested against), then the fused path, in one run")
    p.add_argument("--compare-float32", action="store_true",
                   help="on the CPU, first run the fused path with its weight GEMMs on the float32 "
                   "weights (INFERNIX_CPU_GEMV=0), then on the GGUF's blocks, in one run")
    p.add_argument("--compare-serial", action="store_true",
                   help="also run the fused path with the engine's pipeline off (launch step n+1 "
                   "only after step n's commit), before the pipelined one, in one run")
    p.add_argument("--breakdown", action="store_true",
                   help="time forward and sample per batch size (CUDA events; the wall clock on "
                   "the CPU) beside the memory floor; host share and idle device from the TPOT")
    p.add_argument("--no-cuda-graphs", action="store_true", help="our engine without decode graphs")
    p.add_argument("--stagger-ms", type=float, metavar="MS",
                   help="also rounds whose requests arrive MS apart (unconstrained and with the "
                   "schemas): p50 TPOT with prefill steps among the decode steps, against the "
                   "simultaneous round's steady step")
    p.add_argument("--logprobs", type=int, metavar="N",
                   help="also an unconstrained round whose rows ask for logprobs with N "
                   "alternatives, in the same run (its TPOT beside the plain round's)")
    p.add_argument("--log-level", default="WARNING", help="engine log level (default: WARNING)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run)


def _run_spec(args: argparse.Namespace) -> int:
    if args.acceptance is not None:  # the known-acceptance matrix
        from bench.acceptance_bench import run
    else:
        from bench.spec import run

    return run(args)


def _run_prefix(args: argparse.Namespace) -> int:
    from bench.prefix import run

    return run(args)


def add_spec_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("spec", help="speculative decoding against ordinary decoding, as JSON",
                       description="n-gram copy and the oracle proposer (the target's own greedy "
                       "continuation) on copy-heavy structured tasks, constrained and not: "
                       "speed-up, accepted length, exposed draft wait, greedy equality.")
    p.add_argument("--model", choices=MODELS, default="smollm2",
                   help="default: smollm2 (qwen35-9b-random: with its MTP module, for --backends "
                   "mtp)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--tasks", nargs="+", choices=("extract", "rewrite", "forms"),
                   default=["extract", "rewrite"], help="default: extract rewrite")
    p.add_argument("--backends", nargs="+", choices=("ngram", "ngram-alone", "grammar", "oracle",
                                                     "mtp", "dflash", "dflash2"),
                   default=["ngram", "oracle"], help="default: ngram oracle (ngram-alone: without "
                   "grammar drafts; grammar: grammar drafts alone; dflash, dflash2: a "
                   "random-weight draft of the target's width, its cost per round)")
    p.add_argument("--draft-layers", type=int, default=2,
                   help="layers of the random DFlash draft (default: 2)")
    p.add_argument("--num-draft-tokens", type=int, nargs="+", default=[2, 4], metavar="K",
                   help="K values (default: 2 4)")
    p.add_argument("--batch-size", type=int, default=1, help="concurrent requests (default: 1)")
    p.add_argument("--max-tokens", type=int, default=96, help="output tokens per request "
                   "(default: 96)")
    p.add_argument("--no-cuda-graphs", action="store_true", help="ordinary decode without graphs")
    p.add_argument("--log-level", default="WARNING", help="engine log level (default: WARNING)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    _add_acceptance_arguments(p)
    p.set_defaults(func=_run_spec)


def _add_acceptance_arguments(p: argparse.ArgumentParser) -> None:
    # `bench spec --acceptance`: bench/acceptance_bench.py, at known acceptance rates.
    p.add_argument("--acceptance", type=float, nargs="+", metavar="P",
                   help="known acceptance rates in [0, 1]: drafts are the target's own greedy "
                   "continuation, each corrupted with probability 1 - P, while the backend's real "
                   "draft passes run (--backends among oracle mtp dflash dflash2)")
    p.add_argument("--batch-sizes", type=int, nargs="+", metavar="B",
                   help="with --acceptance: batch sizes (default: --batch-size)")
    p.add_argument("--blocks", type=int, nargs="+", default=[8], metavar="N",
                   help="with --acceptance: DFlash block sizes, K = N - 1 (default: 8)")
    p.add_argument("--modes", nargs="+", choices=("unconstrained", "constrained"),
                   default=["unconstrained", "constrained"],
                   help="with --acceptance: default: unconstrained constrained")
    p.add_argument("--seed", type=int, default=0,
                   help="with --acceptance: seed of the corruption stream (default: 0)")


def add_prefix_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prefix",
                       help="TTFT of a long shared prefix, cold and as a prefix-cache hit",
                       description="Greedy requests that share a ~2,000-token document: the first "
                       "prefills it all (cold), later ones find its KV blocks cached (hit); TTFT, "
                       "cached tokens and TPOT of both, and a round with the cache off, as JSON.")
    p.add_argument("--model", choices=MODELS, default="smollm2", help="default: smollm2")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: cpu)")
    p.add_argument("--prefix-tokens", type=int, default=2000,
                   help="shared prefix length (default: 2000)")
    p.add_argument("--repeats", type=int, default=2,
                   help="distinct documents, one cold request each (default: 2)")
    p.add_argument("--hits", type=int, default=2, help="hit requests per document (default: 2)")
    p.add_argument("--max-tokens", type=int, default=8,
                   help="output tokens per request (default: 8)")
    p.add_argument("--prefill-chunk", type=int, default=512,
                   help="engine prefill chunk (default: 512)")
    p.add_argument("--chat", action="store_true",
                   help="the document as the system message and each question as the user's "
                   "(through the chat template) instead of one raw text")
    p.add_argument("--switch", choices=("prefill_graphs", "fla", "gemv"),
                   help="run the rounds twice in this process, with this operator switch off "
                   "(0) then on (1): the JSON's `runs`")
    p.add_argument("--log-level", default="WARNING", help="engine log level (default: WARNING)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run_prefix)


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """`infernix bench grammar` (its measurements live in bench/grammar.py)."""
    p = sub.add_parser("grammar", help="constraint compile, mask, lookahead and sampling costs")
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen3.5"], choices=GRAMMAR_MODELS,
                   help="default: smollm2 qwen3.5")
    p.add_argument("--cases", nargs="*", help="only these case names (default: all)")
    p.add_argument("--redis-url", default="",
                   help="also measure the typical schemas through GrammarCache with this Redis "
                        "(default: off)")
    p.add_argument("--repeats", type=int, default=3, help="cold compiles per case (default: 3)")
    p.add_argument("--case-budget-s", type=float, default=60.0,
                   help="CPU seconds of walking per case before it is cut short (default: 60)")
    p.add_argument("--sample-s", type=float, default=3.0,
                   help="CPU seconds of random walks per case (0: skip; default: 3)")
    p.add_argument("--sample-tokens", type=int, default=120,
                   help="max tokens per random walk (default: 120)")
    p.add_argument("--label", default="",
                   help="a free-form label stored in the JSON (default: none)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run_bench)


def _run_bench(args: argparse.Namespace) -> int:
    from bench.grammar import run

    return run(args)


def add_store_bench_parser(sub: argparse._SubParsersAction) -> None:
    """`infernix bench grammar-store` (bench/grammar_store.py: the store policy's data)."""
    p = sub.add_parser("grammar-store", help="stored grammar vs compile: the store policy's data")
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen3.5"], choices=GRAMMAR_MODELS,
                   help="default: smollm2 qwen3.5")
    p.add_argument("--redis-url", default="",
                   help="also time the Redis round trip of each record (default: off)")
    p.add_argument("--quick", action="store_true", help="fewer slow grammars")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run_store_bench)


def add_bounded_strings_parser(sub: argparse._SubParsersAction) -> None:
    """`infernix bench bounded-strings` (bench/bounded_strings.py)."""
    p = sub.add_parser("bounded-strings", help="mask fills inside maxLength strings of framed "
                       "grammars: the counted repetition, the rule chain and the product's engine")
    p.add_argument("--models", nargs="+", default=["smollm2", "qwen3.5"], choices=GRAMMAR_MODELS,
                   help="default: smollm2 qwen3.5")
    p.add_argument("--max-lengths", nargs="+", type=int, default=[60, 300, 2000], metavar="N",
                   help="default: 60 300 2000")
    p.add_argument("--cases", nargs="+", choices=("hermes-args", "hermes-auto", "thinking-json"),
                   help="default: all (hermes-args and hermes-auto on smollm2, thinking-json on "
                   "qwen3.5)")
    p.add_argument("--forms", nargs="+", choices=("before", "xgrammar", "exact", "after"),
                   help="default: all four (see bench/bounded_strings.py)")
    p.add_argument("--case-budget-s", type=float, default=20.0,
                   help="CPU seconds of mask fills per case before it is cut (default: 20)")
    p.add_argument("--out", metavar="FILE", help="also write the JSON here")
    p.set_defaults(func=_run_bounded_strings)


def _run_bounded_strings(args: argparse.Namespace) -> int:
    from bench.bounded_strings import run

    return run(args)


def _run_store_bench(args: argparse.Namespace) -> int:
    from bench.grammar_store import run

    return run(args)
