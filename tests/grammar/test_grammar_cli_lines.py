"""`infernix grammar check`: JSON Lines split on "\\n" only, typed errors for numbers beyond
binary64, and the note on slow compiles."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from services.cli import main
from services.grammar import cli as grammar_cli

# Characters str.splitlines() breaks on that JSON strings may hold raw.
BREAKS = "\u2028\u2029\x1c\x1d\x1e\x85\x0b\x0c"


def _lines(capsys: pytest.CaptureFixture) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.split("\n") if line.strip()]


def test_batch_lines_split_on_newline_only(tmp_path, capsys) -> None:
    """`--batch` answered 175 lines for 100 schemas: a valid line holding U+2028 raw was read as
    two. One answer per line, in order."""
    batch = tmp_path / "b.jsonl"
    rows = [{"json_schema": {"const": f"a{ch}b"},
             "instances": [json.dumps(f"a{ch}b", ensure_ascii=False)]}
            for ch in BREAKS]
    rows.append({"json_schema": {"type": "integer"}, "instances": ["1"]})
    batch.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                     encoding="utf-8")
    assert main(["grammar", "check", "--batch", str(batch)]) == 0
    out = _lines(capsys)
    assert len(out) == len(rows)
    assert all(line["ok"] and line["accepted"] == [True] for line in out)


def test_instances_split_on_newline_only(tmp_path, capsys) -> None:
    schema = tmp_path / "s.json"
    schema.write_text(json.dumps({"type": "string"}))
    instances = tmp_path / "i.jsonl"
    values = [json.dumps(json.dumps(f"x{ch}y", ensure_ascii=False), ensure_ascii=False)
              for ch in BREAKS]
    instances.write_text("\n".join(values) + "\n", encoding="utf-8")
    main(["grammar", "check", "--json-schema-file", str(schema), "--instances", str(instances),
          "--json-whitespace", "any"])
    out = _lines(capsys)[1:]
    assert [line["instance"] for line in out] == list(range(len(BREAKS)))
    assert all(line["accepted"] for line in out)


def test_a_number_beyond_binary64_is_a_typed_error_not_a_traceback(tmp_path) -> None:
    """A schema file holding 1e400 crashed `grammar check` with a traceback."""
    path = tmp_path / "inf.json"
    path.write_text('{"type": "number", "maximum": 1e400}')
    batch = tmp_path / "inf.jsonl"
    batch.write_text('{"json_schema": {"maximum": 1e400}}\n{"json_schema": {"type": "null"}}\n')
    for args in (["--json-schema-file", str(path)], ["--batch", str(batch)]):
        done = subprocess.run([sys.executable, "-m", "services.cli", "grammar", "check", *args],
                              capture_output=True, text=True, timeout=300)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.returncode == 2
        first = json.loads(done.stdout.split("\n")[0])
        assert first["ok"] is False and first["error"]["type"] == "InvalidRequest"
    assert json.loads(done.stdout.split("\n")[1])["ok"] is True  # the batch goes on


def test_slow_compiles_get_a_note_on_stderr(tmp_path, capsys, monkeypatch) -> None:
    """'the CLI says when a compile is slow' (more than SLOW_COMPILE_MS)."""
    path = tmp_path / "s.json"
    path.write_text(json.dumps({"type": "integer"}))
    main(["grammar", "check", "--json-schema-file", str(path)])
    assert "slow" not in capsys.readouterr().err
    monkeypatch.setattr(grammar_cli, "SLOW_COMPILE_MS", -1.0)
    main(["grammar", "check", "--json-schema-file", str(path)])
    err = capsys.readouterr().err
    assert "slow" in err and str(path) in err
