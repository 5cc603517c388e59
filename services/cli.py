"""The `infernix` console script: one entry point, one subcommand per service or tool.

    infernix serve                      gateway + worker + grammar in one process (embedded default)
    infernix generate ...               one generation from the command line
    infernix grammar check|sample|serve|health
    infernix worker serve ...           the gRPC worker
    infernix gateway serve --worker ADDR [--worker ADDR ...]
    infernix bench grammar|decode ...

Every flag is also an environment variable named after it: --redis-url is INFERNIX_REDIS_URL.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.grammar.cli import env


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"infernix: address {address!r} must be HOST:PORT")
    return host, int(port)


def _add_engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=env("MODEL", "smollm2"),
                   help="built-in model name (default: smollm2, the embedded default)")
    p.add_argument("--device", default=env("DEVICE", "cpu"), help="cpu or cuda")
    p.add_argument("--lanes", type=int, default=int(env("LANES", "4")),
                   help="resident lanes: the largest decode batch (default 4)")
    p.add_argument("--max-len", type=int, default=int(env("MAX_LEN", "2048")),
                   help="positions per lane, prompt plus output (default 2048)")
    p.add_argument("--prefill-chunk", type=int, default=int(env("PREFILL_CHUNK", "512")))
    p.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))


def _open_worker(args: argparse.Namespace, grammar=None, registry=None):
    import torch

    from services.worker.client import open_in_process
    from services.worker.engine import EngineConfig
    from services.worker.runtime import load_runtime

    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    runtime = load_runtime(args.model, device=args.device, dtype=dtype)
    config = EngineConfig(max_batch=args.lanes, max_len=args.max_len,
                          prefill_chunk=args.prefill_chunk)
    return open_in_process(runtime, config, grammar=grammar, registry=registry)


def _api_keys(args: argparse.Namespace) -> frozenset[str]:
    return frozenset(k.strip() for k in (args.api_keys or "").split(",") if k.strip())


def run_serve(args: argparse.Namespace) -> int:
    """Embedded mode: the gateway in front of an in-process worker and grammar service."""
    from services.gateway import serve as serve_gateway
    from shared.logging import configure_logging

    configure_logging(args.log_level)

    async def main() -> None:
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry()  # one /metrics for the gateway, engine and grammar cache
        worker = await asyncio.to_thread(_open_worker, args, None, registry)
        try:
            await serve_gateway(host=args.host, port=args.port, worker=worker,
                                api_keys=_api_keys(args), registry=registry)
        finally:
            await worker.aclose()

    asyncio.run(main())
    return 0


def run_worker_serve(args: argparse.Namespace) -> int:
    from services.grammar.cache import CacheConfig, ModelCaches
    from services.grammar.client import GrpcGrammarClient, InProcessGrammarClient
    from prometheus_client import CollectorRegistry

    from services.worker.service import serve as serve_worker
    from shared.frontends import get_domain
    from shared.logging import configure_logging
    from shared.metrics import GrammarMetrics, serve_metrics

    configure_logging(args.log_level)
    registry = CollectorRegistry()
    serve_metrics(args.metrics_port, registry, args.host)

    async def main() -> None:
        domains = {args.model: get_domain(args.model)}
        metrics = GrammarMetrics(registry)
        if args.grammar:
            host, port = _split_address(args.grammar)
            caches = ModelCaches.open(domains, redis_url=args.redis_url, metrics=metrics,
                                      config=CacheConfig(cache_bytes=args.grammar_cache_bytes,
                                                         read_only=True))
            grammar = GrpcGrammarClient(host, port, caches)
        else:
            caches = ModelCaches.open(domains, redis_url=args.redis_url, metrics=metrics,
                                      config=CacheConfig(cache_bytes=args.grammar_cache_bytes))
            grammar = InProcessGrammarClient(caches)
        worker = await asyncio.to_thread(_open_worker, args, grammar, registry)
        try:
            await serve_worker(host=args.host, port=args.port, worker=worker)
        finally:
            await worker.aclose()

    asyncio.run(main())
    return 0


def run_worker_health(args: argparse.Namespace) -> int:
    """Exit 0 when the worker at --address answers Health (docker health checks)."""
    import json

    from services.worker.remote import GrpcWorkerClient

    async def ask() -> dict:
        client = GrpcWorkerClient(*_split_address(args.address), timeout_s=args.timeout)
        try:
            return await client.health()
        finally:
            await client.aclose()

    try:
        health = asyncio.run(ask())
    except Exception as exc:  # unreachable or unhealthy: the check fails, saying why
        print(json.dumps({"status": "UNREACHABLE", "error": type(exc).__name__}))
        return 1
    print(json.dumps(health, default=str))
    return 0


def run_gateway_serve(args: argparse.Namespace) -> int:
    from services.gateway import serve as serve_gateway
    from services.gateway.pool import WorkerPool
    from services.worker.remote import GrpcWorkerClient
    from shared.logging import configure_logging

    configure_logging(args.log_level)
    addresses = args.worker or [a for a in (env("WORKERS", "") or "").split(",") if a]
    if not addresses:
        raise SystemExit("infernix gateway serve: give at least one --worker HOST:PORT")

    async def main() -> None:
        pool = WorkerPool([GrpcWorkerClient(*_split_address(a)) for a in addresses])
        try:
            await serve_gateway(host=args.host, port=args.port, worker=pool,
                                api_keys=_api_keys(args))
        finally:
            await pool.aclose()

    asyncio.run(main())
    return 0


def build_parser() -> argparse.ArgumentParser:
    from services.grammar import bench as grammar_bench
    from services.grammar import cli as grammar_cli
    from services.worker import bench as decode_bench
    from services.worker import cli as worker_cli

    parser = argparse.ArgumentParser(prog="infernix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run Infernix on its embedded default (CPU, in-memory)")
    serve.add_argument("--host", default=env("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(env("PORT", "8000")))
    serve.add_argument("--api-keys", default=env("API_KEYS", ""),
                       help="comma-separated keys; when set, requests must carry one")
    _add_engine_args(serve)
    serve.set_defaults(func=run_serve)

    worker_cli.add_generate_parser(sub)
    grammar_cli.add_parser(sub)

    worker = sub.add_parser("worker", help="the gRPC worker")
    wsub = worker.add_subparsers(dest="worker_command", required=True)
    wserve = wsub.add_parser("serve", help="run the gRPC WorkerService")
    wserve.add_argument("--host", default=env("HOST", "127.0.0.1"))
    wserve.add_argument("--port", type=int, default=int(env("PORT", "50052")))
    wserve.add_argument("--grammar", default=env("GRAMMAR", None) or None, metavar="HOST:PORT",
                        help="the grammar service; omitted: compile in process")
    wserve.add_argument("--redis-url", default=env("REDIS_URL", None) or None)
    wserve.add_argument("--grammar-cache-bytes", type=int,
                        default=int(env("GRAMMAR_CACHE_BYTES", str(256 << 20))))
    wserve.add_argument("--metrics-port", type=int, default=int(env("METRICS_PORT", "0")),
                        help="serve Prometheus /metrics on this port (0: off)")
    _add_engine_args(wserve)
    wserve.set_defaults(func=run_worker_serve)
    whealth = wsub.add_parser("health", help="ask a running worker for its health")
    whealth.add_argument("--address", default="127.0.0.1:50052", metavar="HOST:PORT")
    whealth.add_argument("--timeout", type=float, default=3.0)
    whealth.set_defaults(func=run_worker_health)

    gateway = sub.add_parser("gateway", help="the HTTP gateway")
    gsub = gateway.add_subparsers(dest="gateway_command", required=True)
    gserve = gsub.add_parser("serve", help="serve OpenAI/Anthropic HTTP in front of gRPC workers")
    gserve.add_argument("--host", default=env("HOST", "127.0.0.1"))
    gserve.add_argument("--port", type=int, default=int(env("PORT", "8000")))
    gserve.add_argument("--worker", action="append", metavar="HOST:PORT",
                        help="a worker address; repeat for several (INFERNIX_WORKERS: a,b)")
    gserve.add_argument("--api-keys", default=env("API_KEYS", ""))
    gserve.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    gserve.set_defaults(func=run_gateway_serve)

    bench = sub.add_parser("bench", help="benchmarks writing JSON")
    bsub = bench.add_subparsers(dest="bench_command", required=True)
    grammar_bench.add_parser(bsub)
    decode_bench.add_parser(bsub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
