"""A small slice in the shape of the held-out corpus (docs/schema-corpus.md), through
`infernix grammar check --batch`: every schema compiles or is refused with a typed error and a
pointer; no value `jsonschema` rejects is accepted; every value it accepts is accepted in the
generation layout. The schemas are written here in the shapes the corpus has (Kubernetes with
vendor keys, draft-04 with boolean bounds and formats, function-calling arguments, schema-store
documents with patternProperties and dependencies); invalid values are mutations of the valid ones
that jsonschema rejects (scripts/schema_corpus.py `mutate`).
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import jsonschema

from services.cli import main

D4 = "http://json-schema.org/draft-04/schema#"
D7 = "http://json-schema.org/draft-07/schema#"

SLICE = [
    (
        {
            "description": "PodCondition",
            "type": "object",
            "required": ["type", "status"],
            "properties": {
                "type": {"type": "string"},
                "status": {"type": "string", "enum": ["True", "False", "Unknown"]},
                "lastProbeTime": {"type": ["string", "null"], "format": "date-time"},
                "reason": {"type": ["string", "null"]},
            },
            "x-kubernetes-group-version-kind": [{"group": "", "kind": "Pod", "version": "v1"}],
        },
        [
            {"type": "Ready", "status": "True"},
            {"type": "Ready", "status": "False", "lastProbeTime": None, "reason": "x"},
            {"type": "Init", "status": "Unknown", "lastProbeTime": "2024-05-01T10:00:00Z"},
        ],
    ),
    (
        {
            "$schema": D4,
            "type": "object",
            "properties": {
                "port": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": 65535,
                    "exclusiveMaximum": True,
                },
                "host": {"type": "string", "format": "hostname"},
                "ip": {"type": "string", "format": "ipv4"},
                "id": {"type": "string", "pattern": "^[a-f0-9]{8}$"},
            },
            "required": ["port"],
            "additionalProperties": False,
        },
        [{"port": 80}, {"port": 8080, "host": "example.org", "ip": "10.0.0.1", "id": "deadbeef"}],
    ),
    (
        {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City and country"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 14},
            },
            "required": ["location"],
        },
        [{"location": "Paris, France"}, {"location": "Oslo", "unit": "celsius", "days": 3}],
    ),
    (
        {
            "$schema": D7,
            "type": "object",
            "definitions": {"dep": {"type": "string", "minLength": 1}},
            "properties": {
                "name": {"type": "string", "maxLength": 214, "pattern": "^[a-z0-9-]+$"},
                "version": {"type": "string"},
                "main": {"type": "string"},
                "dependencies": {
                    "type": "object",
                    "additionalProperties": {"$ref": "#/definitions/dep"},
                },
            },
            "patternProperties": {"^x-": {}},
            "dependencies": {"main": ["name"]},
        },
        [
            {"name": "left-pad", "version": "1.3.0"},
            {"name": "a", "main": "index.js", "dependencies": {"b": "^1"}},
            {"x-extra": [1, 2]},
        ],
    ),
    (
        {
            "type": "object",
            "properties": {
                "kind": {"const": "circle"},
                "r": {"type": "number", "exclusiveMinimum": 0},
            },
            "required": ["kind", "r"],
            "if": {"properties": {"r": {"maximum": 1}}},
            "then": {"properties": {"label": {"type": "string", "format": "uuid"}}},
        },
        [
            {"kind": "circle", "r": 0.5},
            {"kind": "circle", "r": 3, "label": "x"},
            {"kind": "circle", "r": 1, "label": "2eb8aa08-aa98-11ea-b4aa-73b441d16380"},
        ],
    ),
    (
        {
            "type": "array",
            "items": {"enum": ["read", "write", "admin"]},
            "uniqueItems": True,
            "maxItems": 3,
        },
        [[], ["read"], ["admin", "read"]],
    ),
    (
        {
            "type": "object",
            "properties": {"mode": {"type": "string"}},
            "oneOf": [{"required": ["mode"]}, {"required": ["preset"]}],
        },
        [{"mode": "fast"}, {"preset": 1}],
    ),
    (
        {
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
            },
        },
        [{"tags": ["a", "b"]}, {"tags": ["\u00e9", "e", "1"]}, {}],
    ),  # uniqueItems over any string: kept by the unique-items companion
    ({"type": "string", "format": "idn-email"}, []),  # refused: unknown format
]


def _mutate():
    path = Path(__file__).resolve().parents[2] / "scripts" / "schema_corpus.py"
    spec = importlib.util.spec_from_file_location("schema_corpus", path)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module.mutate


def test_corpus_slice_through_grammar_check_batch(tmp_path, capsys):
    """The goal figures of issue 8 on a slice: compiled or typed rejection with a pointer,
    0 invalid values accepted, every valid value accepted."""
    mutate = _mutate()
    lines, labels = [], []
    for schema, valid in SLICE:
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        v = cls(schema, format_checker=cls.FORMAT_CHECKER)
        values = list(valid)
        rng = random.Random(len(lines))
        for value in valid:
            assert v.is_valid(value), value
            for _ in range(6):
                m = mutate(value, rng)
                if not v.is_valid(m):
                    values.append(m)
        labels.append([v.is_valid(x) for x in values])
        lines.append(json.dumps({"json_schema": schema, "values": values}))
    batch = tmp_path / "slice.jsonl"
    batch.write_text("\n".join(lines) + "\n")
    main(["grammar", "check", "--batch", str(batch)])
    results = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert len(results) == len(SLICE)
    compiled = 0
    for (schema, _), result, label in zip(SLICE, results, labels):
        if not result["ok"]:
            assert result["error"]["type"] in ("UnsupportedSchema", "InvalidSchema")
            assert "pointer" in result["error"], result
            continue
        compiled += 1
        got = result.get("values_accepted", [])
        raw = result.get("values_accepted_raw", [])
        assert len(got) == len(label)
        for ok, acc, acc_raw in zip(label, got, raw):
            assert acc == ok, (schema, result)
            assert ok or not acc_raw
    assert compiled == len(SLICE) - 1
    assert "x-kubernetes-group-version-kind" in results[0]["annotations"]
