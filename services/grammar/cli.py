"""`infernix grammar ...`: check, sample and serve constraints from the command line.

check   compiles each constraint and prints one JSON line per constraint:
        {"ok": true, "kind": ..., "compile_ms": ...} or {"ok": false, "error": {...}}
        With --instances, one line per candidate output: {"instance": i, "accepted": bool}
        (i counts the file's lines from 0). Exit status 0 when all compiled, 2 when any was
        rejected. --batch FILE.jsonl: many constraints in one process, one output line per input
        line; a json_schema line may carry "values" (JSON values, checked in the generation layout
        under the `any` whitespace profile unless the line or --json-whitespace names one:
        "values_accepted", and as plain json.dumps text: "values_accepted_raw"). Schema lines
        list the keywords read as annotations ("annotations").
sample  random walks through the legal masks (see services.grammar.engines.matching.random_walk).
serve   the grpclib GrammarService.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from typing import Any, Iterable, TextIO

from services.constraint_flags import add_constraint_args, constraints_from_args, read_text_file
from services.settings import UsageError, add_settings, default, switch
from shared.contract import OutputConstraint, parse_json_text
from shared.errors import InfernixError, InvalidRequest
from shared.frontends import MODELS, get_domain

EXIT_OK = 0
EXIT_REJECTED = 2


def constraint_from_batch_line(obj: Any) -> OutputConstraint:
    """One --batch input object: exactly one of json_schema, grammar, regex, choice, json_object
    (JSON ones may add "whitespace": any | compact | indented)."""
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
    ws = obj.get("whitespace")
    if name == "json_schema":
        return OutputConstraint.json_schema(value, whitespace=ws)
    if name == "grammar":
        return OutputConstraint.grammar(value)
    if name == "regex":
        return OutputConstraint.regex(value)
    if name == "choice":
        return OutputConstraint.choice(value)
    if value is not True:
        raise InvalidRequest("json_object must be true", field="json_object")
    return OutputConstraint.json_object(whitespace=ws)


def _error_json(exc: InfernixError) -> dict[str, Any]:
    return {"ok": False, "error": exc.to_dict()}


def _read_instances(path: str) -> list[str]:
    out = []
    for n, line in enumerate(_lines(read_text_file(path))):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} line {n + 1} is not JSON: {exc}") from None
        if not isinstance(value, str):
            raise UsageError(f"{path} line {n + 1}: an instance must be a JSON string")
        out.append(value)
    return out


def _lines(text: str) -> list[str]:
    """JSON Lines: split on "\\n" only (str.splitlines would also split inside a line at
    U+2028/U+2029, \\x1c-\\x1e, \\x85 ..., which JSON strings may hold raw)."""
    return text.split("\n")


SLOW_COMPILE_MS = 5000.0  # a compile slower than this gets a note on stderr


def _note_slow(label: str, outcome: Any) -> None:
    if outcome.compile_ms > SLOW_COMPILE_MS:
        print(f"note: {label} took {outcome.compile_ms / 1000:.1f} s to compile (slow: more than "
              f"{SLOW_COMPILE_MS / 1000:.0f} s; the service refuses a compile past its deadline)",
              file=sys.stderr)


def _emit(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def _schema_report(schema: Any, values: list[Any], grammar: Any, accepts: Any) -> dict[str, Any]:
    """The annotation keywords a schema's reduction ignored, and for each JSON value of a batch
    line's "values": accepted in the generation layout, and accepted as plain json.dumps text."""
    from services.grammar.schema import check_schema, layout_values

    reduced = check_schema(schema, unique_names=True,
                           unique_items=True)  # content: names and items kept unique
    report: dict[str, Any] = {"annotations": list(reduced.annotations)}
    if values:
        report["values_accepted"] = [accepts(grammar, t) for t in layout_values(schema, values)]
        report["values_accepted_raw"] = [accepts(grammar, json.dumps(v, ensure_ascii=False))
                                         for v in values]
    return report


def _checker(constraint: OutputConstraint, domain: Any) -> Any:
    """`accepts` as the worker decodes `constraint`: with the JSON name companion where the
    output gets one (a text repeating a member name is then no output), and its JSON length
    companion (a fresh one per text)."""
    from services.grammar.engines.matching import accepts
    from services.grammar.json_lengths import json_lengths_for
    from services.grammar.json_names import json_names_for
    from services.grammar.unique_items import repeats_an_item

    unique = json_names_for(constraint, domain) is not None

    def check(grammar: Any, text: str) -> bool:
        return accepts(grammar, text, unique_names=unique,
                       lengths=json_lengths_for(constraint, domain)) and \
            not repeats_an_item(constraint, text.encode("utf-8"))

    return check


def run_check(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from services.grammar.compiler import ModelCompiler

    status = EXIT_OK
    if args.batch:
        lines: Iterable[str] = [ln for ln in _lines(read_text_file(args.batch)) if ln.strip()]
        compiler = ModelCompiler(get_domain(args.model))
        for n, line in enumerate(lines):
            result: dict[str, Any]
            try:
                obj = parse_json_text(line, field="line")
                ws = getattr(args, "json_whitespace", None)
                if isinstance(obj, dict) and "whitespace" not in obj and (ws or obj.get("values")):
                    # A line's own profile, else --json-whitespace; values are checked in the
                    # generation layout without whitespace, which the contract's `any` profile
                    # holds (a model's default may require indentation).
                    obj = {**obj, "whitespace": ws or "any"}
                constraint = constraint_from_batch_line(obj)
                outcome = compiler.compile(constraint)
                _note_slow(f"batch entry {n + 1}", outcome)
            except InfernixError as exc:
                _emit(out, _error_json(exc))
                status = EXIT_REJECTED
                continue
            except json.JSONDecodeError as exc:
                _emit(
                    out, _error_json(InvalidRequest(f"batch line is not JSON: {exc}", field="line"))
                )
                status = EXIT_REJECTED
                continue
            result = {"ok": True, "kind": constraint.kind.value,
                      "compile_ms": round(outcome.compile_ms, 3)}
            instances = obj.get("instances") or []
            check = _checker(constraint, compiler.domain)
            result["accepted"] = [check(outcome.grammar, s) for s in instances]
            if constraint.kind.value == "json_schema":
                result.update(_schema_report(constraint.schema, obj.get("values") or [],
                                             outcome.grammar, check))
            _emit(out, result)
        return status

    try:
        pairs = constraints_from_args(args)
    except InfernixError as exc:
        _emit(out, _error_json(exc))
        return EXIT_REJECTED
    instances = _read_instances(args.instances) if args.instances else []
    compiler = ModelCompiler(get_domain(args.model))
    for label, constraint in pairs:
        try:
            outcome = compiler.compile(constraint)
            _note_slow(label, outcome)
        except InfernixError as exc:
            _emit(out, {**_error_json(exc), "source": label})
            status = EXIT_REJECTED
            continue
        line = {"ok": True, "kind": constraint.kind.value, "source": label,
                "compile_ms": round(outcome.compile_ms, 3)}
        check = _checker(constraint, compiler.domain)
        if constraint.kind.value == "json_schema":
            line.update(_schema_report(constraint.schema, [], outcome.grammar, check))
        _emit(out, line)
        for i, text in enumerate(instances):
            _emit(out, {"instance": i, "accepted": check(outcome.grammar, text)})
    return status


def run_sample(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    from services.grammar.compiler import ModelCompiler
    from services.grammar.engines.matching import random_walk

    try:
        [(_, constraint)] = constraints_from_args(args)  # files are read before the vocabulary
        domain = get_domain(args.model)
        outcome = ModelCompiler(domain).compile(constraint)
    except InfernixError as exc:
        _emit(out, _error_json(exc))
        return EXIT_REJECTED
    from services.grammar.json_lengths import json_lengths_for
    from services.grammar.json_names import json_names_for
    from services.grammar.unique_items import unique_items_for

    rng = random.Random(args.seed)
    for _ in range(args.n):
        walk = random_walk(outcome.grammar, domain, rng, max_tokens=args.max_tokens,
                           end_bias=args.end_bias, names=json_names_for(constraint, domain),
                           items=unique_items_for(constraint, domain),
                           lengths=json_lengths_for(constraint, domain))
        _emit(out, {"text": walk.text, "completed": walk.completed, "tokens": walk.tokens})
    return EXIT_OK


def add_parser(sub: argparse._SubParsersAction) -> None:
    grammar = sub.add_parser("grammar", help="the grammar-compile service and its tools")
    gsub = grammar.add_subparsers(dest="grammar_command", required=True, metavar="COMMAND")

    check = gsub.add_parser("check", help="compile constraints and test candidate outputs")
    check.add_argument("--model", default="smollm2", choices=MODELS, help="default: smollm2")
    add_constraint_args(check, many_files=True)
    check.add_argument("--instances", metavar="FILE.jsonl",
                       help="candidate outputs, one JSON string a line")
    check.add_argument(
        "--batch", metavar="FILE.jsonl", help="many constraints, one JSON object a line"
    )
    check.set_defaults(func=run_check)

    sample = gsub.add_parser("sample", help="random legal walks through a constraint")
    sample.add_argument("--model", default="smollm2", choices=MODELS, help="default: smollm2")
    add_constraint_args(sample, many_files=False)
    sample.add_argument("--n", type=int, default=5, help="walks (default: 5)")
    sample.add_argument("--seed", type=int, default=0, help="default: 0")
    sample.add_argument(
        "--max-tokens", type=int, default=256, help="tokens per walk (default: 256)"
    )
    sample.add_argument("--end-bias", type=float, default=0.5,
                        help="probability of taking EOS whenever it is legal (default: 0.5)")
    sample.set_defaults(func=run_sample)

    serve = gsub.add_parser("serve", help="run the gRPC GrammarService")
    add_settings(serve, "host", "port", "redis_url", "grammar_cache_bytes", "metrics_port",
                 "log_level", port=50051)
    serve.add_argument(
        "--models",
        nargs="+",
        default=switch("models").split(","),
        choices=MODELS,
        help=f"models to serve (default: {default('models')}; env INFERNIX_MODELS=a,b)",
    )
    add_compile_args(serve, isolation="process")
    serve.set_defaults(func=run_serve)

    health = gsub.add_parser("health", help="ask a running grammar service for its health")
    health.add_argument("--address", default="127.0.0.1:50051", metavar="HOST:PORT",
                        help="the service (default: 127.0.0.1:50051)")
    health.add_argument("--timeout", type=float, default=3.0, help="seconds (default: 3)")
    health.set_defaults(func=run_health)


def add_compile_args(p: argparse.ArgumentParser, *, isolation: str) -> None:
    """The compile limits, cold slots and store policy (services/settings.py's table);
    `isolation` is this command's default for --compile-isolation."""
    add_settings(p, "compile_deadline_s", "compile_memory_bytes", "max_cold_compiles",
                 "cold_slot_wait_s", "compile_isolation", "grammar_store_min_speedup",
                 "grammar_load_ms_per_mb", "compile_reject_ttl_s", "grammar_load_ms_fixed",
                 compile_isolation=isolation)


def cache_config_from_args(args: argparse.Namespace, **overrides: Any):
    """The CacheConfig that `add_compile_args` flags (and `overrides`) describe."""
    from services.grammar.cache.grammar_cache import CacheConfig
    from services.grammar.cache.limits import CompileLimits, StorePolicy

    fields = dict(
        max_cold_compiles=args.max_cold_compiles, slot_wait_s=args.cold_slot_wait_s,
        isolation=args.compile_isolation, reject_ttl_s=args.compile_reject_ttl_s,
        limits=CompileLimits(args.compile_deadline_s, args.compile_memory_bytes),
        policy=StorePolicy(args.grammar_load_ms_per_mb, args.grammar_store_min_speedup,
                           args.grammar_load_ms_fixed))
    fields.update(overrides)
    return CacheConfig(**fields)


def add_client_args(p: argparse.ArgumentParser) -> None:
    """A worker's GrpcGrammarClient settings (services/settings.py's table)."""
    add_settings(p, "grammar_timeout_s", "grammar_retry_s", "grammar_fallback")


def client_kwargs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """GrpcGrammarClient keyword arguments from `add_client_args` flags."""
    return {"timeout_s": args.grammar_timeout_s, "retry_s": args.grammar_retry_s,
            "fallback": args.grammar_fallback == "on"}


def run_health(args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Exit 0 when the service at --address answers Health with SERVING (docker health checks;
    `python -m services.grammar.health` is the same check without this CLI's imports)."""
    from services.grammar.health import check

    return check(args.address, args.timeout, out)


def run_serve(args: argparse.Namespace) -> int:
    import asyncio

    from services.grammar.service import serve
    from shared.logging import configure_logging

    configure_logging(args.log_level)
    config = cache_config_from_args(args, cache_bytes=args.grammar_cache_bytes)
    asyncio.run(serve(host=args.host, port=args.port, redis_url=args.redis_url,
                      cache_bytes=args.grammar_cache_bytes, models=tuple(args.models),
                      metrics_port=args.metrics_port, config=config))
    return EXIT_OK
