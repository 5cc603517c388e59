"""`infernix grammar check --batch` and the JSON whitespace profile: a line's own "whitespace"
wins, else `--json-whitespace` applies to every JSON line (it was silently ignored)."""

from __future__ import annotations

import json

from services.cli import main

SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
          "additionalProperties": False}
COMPACT, SPACED = '{"a":1}', '{"a": 1}'


def test_batch_honours_json_whitespace(tmp_path, capsys) -> None:
    rows = [{"json_schema": SCHEMA, "instances": [COMPACT, SPACED]},
            {"json_object": True, "instances": ["{}", "{ }"]},
            {"json_schema": SCHEMA, "whitespace": "any", "instances": [COMPACT, SPACED]},
            {"regex": "[0-9]+", "instances": ["12"]}]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["grammar", "check", "--batch", str(batch), "--json-whitespace", "compact"]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert [ln["accepted"] for ln in lines] == [[True, False], [True, False], [True, True], [True]]
    assert main(["grammar", "check", "--batch", str(batch), "--json-whitespace", "any"]) == 0
    lines = [json.loads(ln) for ln in capsys.readouterr().out.splitlines() if ln.strip()]
    assert [ln["accepted"] for ln in lines][:2] == [[True, True], [True, True]]
