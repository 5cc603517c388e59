"""The content-constraint flags of `infernix generate` and `infernix grammar check|sample`
(--json-schema-file, --grammar-file, --regex, --choice, --json-object, --json-whitespace) and the
OutputConstraints they name. Light: nothing here imports the grammar service or the worker."""

from __future__ import annotations

import argparse
from typing import Any

from services.settings import UsageError
from shared.contract import OutputConstraint
from shared.errors import InvalidRequest


def add_constraint_args(p: argparse.ArgumentParser, *, many_files: bool) -> None:
    """The content-constraint flags (one of them; `many_files`: a file flag takes several)."""
    nargs = "+" if many_files else None
    group = p.add_mutually_exclusive_group()
    group.add_argument("--json-schema-file", nargs=nargs, metavar="F", help="JSON Schema file(s)")
    group.add_argument("--grammar-file", nargs=nargs, metavar="F",
                       help="GBNF file(s), entry rule root")
    group.add_argument("--regex", metavar="R", help="whole-content regex")
    group.add_argument("--choice", action="append", metavar="C", help="one literal option; repeat")
    group.add_argument("--json-object", action="store_true", help="any JSON object")
    p.add_argument("--json-whitespace", choices=("any", "compact", "indented"), default=None,
                   help="whitespace between JSON tokens: any (runs of at most 32), compact "
                        "(none) or indented (2-space layout); default: the model's default")


def read_text_file(path: str) -> str:
    """The text of a file the command line names; raises UsageError (one line, exit 2)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"{path} is not UTF-8 text: {exc}") from None


def constraints_from_args(args: argparse.Namespace) -> list[tuple[str, OutputConstraint]]:
    """(label, constraint) pairs; raises InfernixError for bad sources."""

    def listify(v: Any) -> list[str]:
        return v if isinstance(v, list) else [v]

    ws = getattr(args, "json_whitespace", None)
    if args.json_schema_file:
        return [(f, OutputConstraint.json_schema(read_text_file(f), whitespace=ws))
                for f in listify(args.json_schema_file)]
    if args.grammar_file:
        return [(f, OutputConstraint.grammar(read_text_file(f)))
                for f in listify(args.grammar_file)]
    if args.regex is not None:
        return [("regex", OutputConstraint.regex(args.regex))]
    if args.choice:
        return [("choice", OutputConstraint.choice(args.choice))]
    if args.json_object:
        return [("json_object", OutputConstraint.json_object(whitespace=ws))]
    raise InvalidRequest(
        "give one constraint: --json-schema-file, --grammar-file, --regex, --choice or "
        "--json-object", field="constraint",
    )
