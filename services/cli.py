"""The `infernix` console script: one entry point, one subcommand per service or tool.

    infernix serve                      gateway + worker + grammar in one process (embedded default)
    infernix generate ...               one generation from the command line
    infernix grammar check|sample|serve|health
    infernix worker serve|health        the gRPC worker
    infernix gateway serve --worker ADDR [--worker ADDR ...]
    infernix bench grammar|decode|spec|prefix|serve|coldstart  benchmarks writing JSON

Every flag is also an environment variable named after it: --redis-url is INFERNIX_REDIS_URL.
Building the parser imports nothing heavy (no torch, xgrammar or transformers): `--help` answers
at once, and a user mistake is one line on stderr with exit status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from services.settings import UsageError, add_settings, switch

ENDPOINTS = ("OpenAI /v1/chat/completions, /v1/responses, /v1/completions, /v1/models; "
             "Anthropic /v1/messages")


def _addresses(values: list[str]) -> list[tuple[str, int]]:
    out = []
    for address in values:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise UsageError(f"address {address!r} must be HOST:PORT")
        out.append((host, int(port)))
    return out


def _api_keys(args: argparse.Namespace) -> frozenset[str]:
    return frozenset(k.strip() for k in (args.api_keys or "").split(",") if k.strip())


def _say(line: str) -> None:
    print(f"infernix: {line}", file=sys.stderr, flush=True)


def _check_port(host: str, port: int) -> None:
    """A port another process holds is a one-line usage error before anything loads (binding
    as the server will, with SO_REUSEADDR, so a socket in TIME_WAIT does not count)."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise UsageError(f"--host {host}: {exc.strerror or exc}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            raise UsageError(f"--port {port}: cannot listen on {host}:{port}: "
                             f"{exc.strerror or exc}") from None


def _worker_settings(cls, args: argparse.Namespace):
    """WorkerSettings from the flags; a feature this build refuses (Unsupported, e.g.
    --speculative mtp) is a one-line usage error naming the flag, before the model loads."""
    from shared.errors import Unsupported

    try:
        return cls.from_args(args)
    except Unsupported as exc:
        flag = "--" + (exc.field or "speculative").replace("_", "-")
        raise UsageError(f"{flag}: unsupported: {exc.message}") from None


# ---------------------------------------------------------------- commands


def run_serve(args: argparse.Namespace) -> int:
    """Embedded mode: the gateway in front of an in-process worker and grammar service."""
    from prometheus_client import CollectorRegistry

    from services.embedded import WorkerSettings, open_worker
    from services.gateway import serve as serve_gateway
    from shared.logging import configure_logging

    configure_logging(args.log_level)
    settings = _worker_settings(WorkerSettings, args)
    _check_port(args.host, args.port)
    names = tuple(args.served_model_name or ())

    async def main() -> None:
        registry = CollectorRegistry()  # one /metrics for the gateway, engine and grammar cache
        _say(f"loading {settings.model} on {settings.device} ...")
        worker = await asyncio.to_thread(open_worker, settings, registry=registry)
        if names:
            from services.gateway.aliases import AliasedWorker

            worker = AliasedWorker(worker, settings.model, names)
        served = ", ".join(names or (settings.model,))
        try:
            await serve_gateway(host=args.host, port=args.port, worker=worker,
                                api_keys=_api_keys(args), registry=registry,
                                ignore_unknown_fields=args.ignore_unknown_fields,
                                on_ready=lambda: _say(
                                    f"serving {served} on http://{args.host}:{args.port} "
                                    f"({ENDPOINTS})"))
        finally:
            await worker.aclose()

    asyncio.run(main())
    return 0


def run_worker_serve(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from services.embedded import WorkerSettings, open_grammar, open_worker
    from services.worker.service import serve as serve_worker
    from shared.logging import configure_logging
    from shared.metrics import serve_metrics

    configure_logging(args.log_level)
    settings = _worker_settings(WorkerSettings, args)
    _check_port(args.host, args.port)
    registry = CollectorRegistry()
    serve_metrics(args.metrics_port, registry, args.host)

    from services.grammar import cli as grammar_cli

    config = grammar_cli.cache_config_from_args(args, cache_bytes=args.grammar_cache_bytes,
                                                read_only=bool(args.grammar))

    async def main() -> None:
        grammar = open_grammar(
            settings.model,
            redis_url=args.redis_url,
            service=args.grammar,
            config=config,
            client_options=grammar_cli.client_kwargs_from_args(args),
            registry=registry,
        )
        worker = await asyncio.to_thread(open_worker, settings, grammar=grammar, registry=registry)
        try:
            await serve_worker(host=args.host, port=args.port, worker=worker,
                               drain_seconds=args.drain_seconds)
        finally:
            await worker.aclose()

    asyncio.run(main())
    _exit_past_compile_threads()
    return 0


def _exit_past_compile_threads() -> None:
    """A compile thread still inside xgrammar's C++ at exit aborts the interpreter ("terminate
    called without an active exception"): leave without waiting for it."""
    import os

    from services.grammar.cache.builders import running_compile_threads

    if running_compile_threads():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


def run_worker_health(args: argparse.Namespace) -> int:
    """Exit 0 when the worker at --address answers Health (docker health checks), 1 while it
    still warms up (its kernels compile before it serves)."""
    import json

    from services.worker.remote import GrpcWorkerClient

    [(host, port)] = _addresses([args.address])

    async def ask() -> dict:
        client = GrpcWorkerClient(host, port, timeout_s=args.timeout)
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
    return 1 if health.get("status") == "warming" else 0


def run_gateway_serve(args: argparse.Namespace) -> int:
    from services.gateway import serve as serve_gateway
    from services.gateway.pool import WorkerPool
    from services.worker.remote import GrpcWorkerClient
    from shared.logging import configure_logging

    configure_logging(args.log_level)
    addresses = args.worker or [a for a in switch("workers").split(",") if a]
    if not addresses:
        raise UsageError("gateway serve: give at least one --worker HOST:PORT "
                         "(or INFERNIX_WORKERS=HOST:PORT,...)")
    workers = _addresses(addresses)
    _check_port(args.host, args.port)

    async def main() -> None:
        pool = WorkerPool([GrpcWorkerClient(host, port) for host, port in workers])
        try:
            await serve_gateway(host=args.host, port=args.port, worker=pool,
                                api_keys=_api_keys(args),
                                ignore_unknown_fields=args.ignore_unknown_fields,
                                drain_seconds=args.drain_seconds)
        finally:
            await pool.aclose()

    asyncio.run(main())
    return 0


# ---------------------------------------------------------------- the parser


# The engine's flags, shared by `serve` (embedded) and `worker serve` (gRPC)
ENGINE_FLAGS = ("lanes", "max_len", "prefill_chunk", "preempt_after", "max_waiting",
                "kv_cache_tokens", "no_prefix_cache", "no_pipeline", "no_warmup", "kernel_cache",
                "log_level", "speculative", "draft_model", "num_draft_tokens", "draft_vocab",
                "logprobs_mode")


def build_parser() -> argparse.ArgumentParser:
    from bench import cli as bench_cli  # the product's one import of bench/: its commands
    from services.grammar import cli as grammar_cli
    from services.worker import cli as worker_cli

    parser = argparse.ArgumentParser(prog="infernix", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = sub.add_parser("serve", help="run Infernix on its embedded default (CPU, in-memory)",
                           description="The gateway, a worker and the grammar service in one "
                           "process: OpenAI- and Anthropic-compatible HTTP.")
    add_settings(
        serve,
        "host",
        "port",
        "api_keys",
        "ignore_unknown_fields",
        "model",
        "served_model_name",
        "device",
        *ENGINE_FLAGS,
    )
    serve.set_defaults(func=run_serve)

    worker_cli.add_generate_parser(sub)
    grammar_cli.add_parser(sub)

    worker = sub.add_parser("worker", help="the gRPC worker")
    wsub = worker.add_subparsers(dest="worker_command", required=True, metavar="COMMAND")
    wserve = wsub.add_parser("serve", help="run the gRPC WorkerService")
    add_settings(
        wserve,
        "host",
        "port",
        "grammar",
        "redis_url",
        "grammar_cache_bytes",
        "drain_seconds",
        "metrics_port",
        "model",
        "device",
        *ENGINE_FLAGS,
        port=50052,
    )
    grammar_cli.add_compile_args(wserve, isolation="process")
    grammar_cli.add_client_args(wserve)
    wserve.set_defaults(func=run_worker_serve)
    whealth = wsub.add_parser("health", help="ask a running worker for its health")
    whealth.add_argument("--address", default="127.0.0.1:50052", metavar="HOST:PORT",
                         help="the worker (default: 127.0.0.1:50052)")
    whealth.add_argument("--timeout", type=float, default=3.0, help="seconds (default: 3)")
    whealth.set_defaults(func=run_worker_health)

    gateway = sub.add_parser("gateway", help="the HTTP gateway")
    gsub = gateway.add_subparsers(dest="gateway_command", required=True, metavar="COMMAND")
    gserve = gsub.add_parser("serve", help="serve OpenAI/Anthropic HTTP in front of gRPC workers")
    add_settings(gserve, "host", "port", "api_keys", "ignore_unknown_fields", "log_level",
                 "drain_seconds")
    gserve.add_argument("--worker", action="append", metavar="HOST:PORT",
                        help="a worker address; repeat for several (env INFERNIX_WORKERS=a,b)")
    gserve.set_defaults(func=run_gateway_serve)

    bench = sub.add_parser("bench", help="benchmarks writing JSON")
    bsub = bench.add_subparsers(dest="bench_command", required=True, metavar="BENCH")
    bench_cli.add_parsers(bsub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UsageError as exc:
        _say(str(exc))
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
