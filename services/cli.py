"""The `infernix` console script: one entry point, one subcommand per service or tool."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    from services.grammar import bench as grammar_bench
    from services.grammar import cli as grammar_cli

    parser = argparse.ArgumentParser(prog="infernix", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    grammar_cli.add_parser(sub)

    serve = sub.add_parser("serve", help="run Infernix on its embedded default (CPU, in-memory)")
    serve.add_argument("--host", default=grammar_cli.env("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(grammar_cli.env("PORT", "8000")))
    serve.set_defaults(func=run_serve)

    bench = sub.add_parser("bench", help="benchmarks writing JSON")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    grammar_bench.add_parser(bsub)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    """Embedded mode. Until the worker and gateway exist this serves the grammar service alone,
    with the in-process cache and both built-in vocabularies."""
    import asyncio

    from services.grammar.service import serve

    asyncio.run(serve(host=args.host, port=args.port, redis_url=None,
                      cache_bytes=256 << 20, models=("smollm2",)))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
