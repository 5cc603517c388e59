"""The `infernix` command line as a user meets it: help answers without heavy imports, every flag
says its default, defaults agree across commands, and a user mistake is one line on stderr with
exit status 2, found before any model or vocabulary is loaded."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import pytest

import shared.frontends
from services.cli import build_parser, main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEAVY = ("torch", "xgrammar", "transformers", "tokenizers")


def _subcommands(parser: argparse.ArgumentParser, path=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subcommands(sub, path + (name,))
    if path:
        yield path, parser


def test_building_the_parser_imports_nothing_heavy():
    """"`infernix --help` and every subcommand's `--help` answer in under a second (no torch,
    xgrammar or transformers import to build the parser)": checked by what is imported, not by
    time (a fresh interpreter builds every subcommand's parser)."""
    code = ("import sys; from services.cli import build_parser; build_parser(); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def test_every_flag_has_help_with_its_default_and_defaults_agree():
    """"every flag of `serve` has help text and its default; defaults agree across commands
    (`--max-len` is 2048 in `serve`, 4096 in `generate`)" was the bug."""
    parser = build_parser()
    shared_defaults: dict[str, set] = {}
    for path, sub in _subcommands(parser):
        for action in sub._actions:
            if not action.option_strings or action.dest == "help":
                continue
            assert action.help, (path, action.option_strings)
            if action.default is not None and not isinstance(action, argparse._StoreTrueAction):
                assert "default" in action.help, (path, action.option_strings, action.help)
            # The product's settings; a bench's --model names what it measures (bench serve:
            # a served model's name, default the server's first).
            if path[0] != "bench" and action.dest in ("max_len", "lanes", "prefill_chunk",
                                                      "device", "model"):
                shared_defaults.setdefault(action.dest, set()).add(action.default)
    assert shared_defaults["max_len"] == {2048}
    assert all(len(v) == 1 for v in shared_defaults.values()), shared_defaults


def test_a_missing_file_is_one_line_and_exit_2_before_the_vocabulary(tmp_path, monkeypatch, capsys):
    """"A user mistake gets one line on stderr and exit status 2; the file is read before any model
    or tokenizer is loaded" (`grammar sample --grammar-file missing.gbnf` printed a traceback
    after ~15 s)."""
    def no_vocabulary(model):
        raise AssertionError("the vocabulary was loaded before the file was read")

    monkeypatch.setattr(shared.frontends, "get_domain", no_vocabulary)
    missing = str(tmp_path / "missing.gbnf")
    for argv in (["grammar", "sample", "--grammar-file", missing],
                 ["grammar", "check", "--json-schema-file", missing],
                 ["generate", "--prompt", "hi", "--grammar-file", missing],
                 ["generate", "--messages", missing]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "missing.gbnf" in err[0] and "Traceback" not in err[0], err


def test_a_process_reports_usage_errors_without_a_traceback(tmp_path):
    env = {**os.environ, "INFERNIX_PORT": "eighty"}
    done = subprocess.run([sys.executable, "-m", "services.cli", "serve", "--help"], cwd=ROOT,
                          env=env, capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "INFERNIX_PORT='eighty'" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("schema", [{"type": "objekt"}, {"type": "string", "format": "idn-email"}])
def test_generate_rejects_an_invalid_schema_before_loading_the_model(tmp_path, monkeypatch,
                                                                      capsys, schema):
    """"CLI commands validate their inputs (files, schemas, grammars) before loading a model"."""
    import services.worker.runtime as runtime

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the schema was checked")

    monkeypatch.setattr(runtime, "load_runtime", no_model)
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(schema))
    assert main(["generate", "--prompt", "hi", "--json-schema-file", str(path)]) == 2
    error = json.loads(capsys.readouterr().err)["error"]
    assert error["type"] in ("InvalidSchema", "UnsupportedSchema") and error["pointer"]
