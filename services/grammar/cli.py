"""`infernix grammar ...`: check, sample and serve constraints from the command line.

check   compiles each constraint and prints one JSON line per constraint:
        {"ok": true, "kind": ..., "compile_ms": ...} or {"ok": false, "error": {...}}
        With --instances, one line per candidate output: {"instance": i, "accepted": bool}
        (i counts the file's lines from 0). Exit status 0 when all compiled, 2 when any was rejected.
        --batch FILE.jsonl: many constraints in one process, one output line per input line; a
        json_schema line may carry "values" (JSON values, checked in the generation layout:
        "values_accepted", and as plain json.dumps text: "values_accepted_raw"). Schema lines
        list the keywords read as annotations ("annotations").
sample  random walks through the legal masks (see services.grammar.matching.random_walk).
serve   the grpclib GrammarService.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any, Iterable, TextIO

from shared.contract import OutputConstraint
from shared.errors import InfernixError, InvalidRequest
from shared.frontends import MODELS, get_domain

EXIT_OK = 0
EXIT_REJECTED = 2


def add_constraint_args(p: argparse.ArgumentParser, *, many_files: bool) -> None:
    nargs = "+" if many_files else None
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json-schema-file", nargs=nargs, metavar="F", help="JSON Schema file(s)")
    group.add_argument("--grammar-file", nargs=nargs, metavar="F", help="GBNF file(s), entry rule root")
    group.add_argument("--regex", metavar="R", help="whole-content regex")
    group.add_argument("--choice", action="append", metavar="C", help="one literal option; repeat")
    group.add_argument("--json-object", action="store_true", help="any JSON object")


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def constraints_from_args(args: argparse.Namespace) -> list[tuple[str, OutputConstraint]]:
    """(label, constraint) pairs; raises InfernixError for bad sources."""

    def listify(v: Any) -> list[str]:
        return v if isinstance(v, list) else [v]

    if args.json_schema_file:
        return [(f, OutputConstraint.json_schema(_read(f))) for f in listify(args.json_schema_file)]
    if args.grammar_file:
        return [(f, OutputConstraint.grammar(_read(f))) for f in listify(args.grammar_file)]
    if args.regex is not None:
        return [("regex", OutputConstraint.regex(args.regex))]
    if args.choice:
        return [("choice", OutputConstraint.choice(args.choice))]
    if args.json_object:
        return [("json_object", OutputConstraint.json_object())]
    raise InvalidRequest(
        "give one constraint: --json-schema-file, --grammar-file, --regex, --choice or --json-object",
        field="constraint",
    )


def constraint_from_batch_line(obj: Any) -> OutputConstraint:
    """One --batch input object: exactly one of json_schema, grammar, regex, choice, json_object."""
    if not isinstance(obj, dict):
        raise InvalidRequest("each batch line must be a JSON object", field="line")
    fields = [k for k in ("json_schema", "grammar", "regex", "choice", "json_object") if k in obj]
    if len(fields) != 1:
        raise InvalidRequest(
            f"each batch line needs exactly one constraint field, found {fields or 'none'}",
            field="constraint",
        )
    name = fields[0]
    value = obj[name]
    if name == "json_schema":
        return OutputConstraint.json_schema(value)
    if name == "grammar":
        return OutputConstraint.grammar(value)
    if name == "regex":
        return OutputConstraint.regex(value)
    if name == "choice":
        return OutputConstraint.choice(value)
    if value is not True:
        raise InvalidRequest("json_object must be true", field="json_object")
    return OutputConstraint.json_object()


def _error_json(exc: InfernixError) -> dict[str, Any]:
    return {"ok": False, "error": exc.to_dict()}


def _read_instances(path: str) -> list[str]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            value = json.loads(line)
            if not isinstance(value, str):
                raise InvalidRequest(f"{path} line {n + 1}: an instance must be a JSON string",
                                     field="instances")
            out.append(value)
    return out


def _emit(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def _schema_report(schema: Any, values: list[Any], grammar: Any, accepts: Any) -> dict[str, Any]:
    """The annotation keywords a schema's reduction ignored, and for each JSON value of a batch
    line's "values": accepted in the generation layout, and accepted as plain json.dumps text."""
    from services.grammar.schema import check_schema, layout_values

    report: dict[str, Any] = {"annotations": list(check_schema(schema).annotations)}
    if values:
        report["values_accepted"] = [accepts(grammar, t) for t in layout_values(schema, values)]
        report["values_accepted_raw"] = [accepts(grammar, json.dumps(v, ensure_ascii=False))
                                         for v in values]
    return report


def run_check(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from services.grammar.compiler import ModelCompiler
    from services.grammar.matching import accepts

    compiler = ModelCompiler(get_domain(args.model))
    status = EXIT_OK
    if args.batch:
        with open(args.batch, encoding="utf-8") as f:
            lines: Iterable[str] = [ln for ln in f if ln.strip()]
        for line in lines:
            result: dict[str, Any]
            try:
                obj = json.loads(line)
                constraint = constraint_from_batch_line(obj)
                outcome = compiler.compile(constraint)
            except InfernixError as exc:
                _emit(out, _error_json(exc))
                status = EXIT_REJECTED
                continue
            except json.JSONDecodeError as exc:
                _emit(out, _error_json(InvalidRequest(f"batch line is not JSON: {exc}", field="line")))
                status = EXIT_REJECTED
                continue
            result = {"ok": True, "kind": constraint.kind.value,
                      "compile_ms": round(outcome.compile_ms, 3)}
            instances = obj.get("instances") or []
            result["accepted"] = [accepts(outcome.grammar, s) for s in instances]
            if constraint.kind.value == "json_schema":
                result.update(_schema_report(constraint.schema, obj.get("values") or [],
                                             outcome.grammar, accepts))
            _emit(out, result)
        return status

    try:
        pairs = constraints_from_args(args)
        instances = _read_instances(args.instances) if args.instances else []
    except InfernixError as exc:
        _emit(out, _error_json(exc))
        return EXIT_REJECTED
    for label, constraint in pairs:
        try:
            outcome = compiler.compile(constraint)
        except InfernixError as exc:
            _emit(out, {**_error_json(exc), "source": label})
            status = EXIT_REJECTED
            continue
        line = {"ok": True, "kind": constraint.kind.value, "source": label,
                "compile_ms": round(outcome.compile_ms, 3)}
        if constraint.kind.value == "json_schema":
            line.update(_schema_report(constraint.schema, [], outcome.grammar, accepts))
        _emit(out, line)
        for i, text in enumerate(instances):
            _emit(out, {"instance": i, "accepted": accepts(outcome.grammar, text)})
    return status


def run_sample(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from services.grammar.compiler import ModelCompiler
    from services.grammar.matching import random_walk

    domain = get_domain(args.model)
    try:
        [(_, constraint)] = constraints_from_args(args)
        outcome = ModelCompiler(domain).compile(constraint)
    except InfernixError as exc:
        _emit(out, _error_json(exc))
        return EXIT_REJECTED
    rng = random.Random(args.seed)
    for _ in range(args.n):
        walk = random_walk(outcome.grammar, domain, rng, max_tokens=args.max_tokens,
                           end_bias=args.end_bias)
        _emit(out, {"text": walk.text, "completed": walk.completed, "tokens": walk.tokens})
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    grammar = sub.add_parser("grammar", help="the grammar-compile service and its tools")
    gsub = grammar.add_subparsers(dest="grammar_command", required=True)

    check = gsub.add_parser("check", help="compile constraints and test candidate outputs")
    check.add_argument("--model", default="smollm2", choices=MODELS)
    add_constraint_args(check, many_files=True)
    check.add_argument("--instances", metavar="FILE.jsonl", help="candidate outputs, one JSON string a line")
    check.add_argument("--batch", metavar="FILE.jsonl", help="many constraints, one JSON object a line")
    check.set_defaults(func=run_check)

    sample = gsub.add_parser("sample", help="random legal walks through a constraint")
    sample.add_argument("--model", default="smollm2", choices=MODELS)
    add_constraint_args(sample, many_files=False)
    sample.add_argument("--n", type=int, default=5)
    sample.add_argument("--seed", type=int, default=0)
    sample.add_argument("--max-tokens", type=int, default=256)
    sample.add_argument("--end-bias", type=float, default=0.5,
                        help="probability of taking EOS whenever it is legal (default 0.5)")
    sample.set_defaults(func=run_sample)

    serve = gsub.add_parser("serve", help="run the gRPC GrammarService")
    serve.add_argument("--host", default=env("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(env("PORT", "50051")))
    serve.add_argument("--redis-url", default=env("REDIS_URL", None) or None,
                       help="shared compiled-grammar store; omitted: in-process cache only")
    serve.add_argument("--grammar-cache-bytes", type=int,
                       default=int(env("GRAMMAR_CACHE_BYTES", str(256 << 20))),
                       help="L1 and Redis budget for compiled grammars (default 256 MiB)")
    serve.add_argument("--models", nargs="+", default=env("MODELS", "smollm2").split(","),
                       choices=MODELS)
    serve.add_argument("--log-level", default=env("LOG_LEVEL", "INFO"))
    serve.add_argument("--metrics-port", type=int, default=int(env("METRICS_PORT", "0")),
                       help="serve Prometheus /metrics on this port (0: off)")
    serve.set_defaults(func=run_serve)

    health = gsub.add_parser("health", help="ask a running grammar service for its health")
    health.add_argument("--address", default="127.0.0.1:50051", metavar="HOST:PORT")
    health.add_argument("--timeout", type=float, default=3.0)
    health.set_defaults(func=run_health)


def run_health(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    """Exit 0 when the service at --address answers Health with SERVING (docker health checks)."""
    import asyncio

    from grpclib.client import Channel

    from shared.proto.grammar_grpc import GrammarStub
    from shared.proto.grammar_pb2 import HealthRequest

    host, _, port = args.address.rpartition(":")

    async def ask() -> dict[str, Any]:
        channel = Channel(host or "127.0.0.1", int(port))
        try:
            reply = await GrammarStub(channel).Health(HealthRequest(), timeout=args.timeout)
            return {"status": reply.status, "models": list(reply.models), "redis_ok": reply.redis_ok}
        finally:
            channel.close()

    try:
        health = asyncio.run(ask())
    except (OSError, asyncio.TimeoutError) as exc:
        _emit(out, {"status": "UNREACHABLE", "error": type(exc).__name__})
        return 1
    _emit(out, health)
    return 0 if health["status"] == "SERVING" else 1


def env(name: str, default: str | None) -> str | None:
    """Every setting is also an environment variable named after its flag: --redis-url is
    INFERNIX_REDIS_URL."""
    import os

    return os.environ.get(f"INFERNIX_{name}", default)


def run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from services.grammar.service import serve
    from shared.logging import configure_logging

    configure_logging(args.log_level)
    asyncio.run(serve(host=args.host, port=args.port, redis_url=args.redis_url,
                      cache_bytes=args.grammar_cache_bytes, models=tuple(args.models),
                      metrics_port=args.metrics_port))
    return EXIT_OK
