"""`infernix grammar check / sample / serve / health` (issue 2 §6), in process and as a real
process over loopback gRPC."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import jsonschema
import pytest

from services.cli import main
from tests.conftest import free_port

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0}},
          "required": ["name", "age"], "additionalProperties": False}


def _lines(capsys: pytest.CaptureFixture) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


def test_check_schema_files_with_instances(tmp_path, capsys) -> None:
    """One JSON line per constraint, then one per instance; instance verdicts agree with
    jsonschema; exit 2 when any constraint was rejected."""
    good = tmp_path / "good.json"
    good.write_text(json.dumps(SCHEMA))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"type": "string", "format": "idn-email"}))
    candidates = ['{"name": "Ada", "age": 36}', '{"name": "Ada"}', '{"age": 3, "name": "x"}',
                  '{"name": "much too long", "age": 1}', '{"name": "Bo", "age": -1}']
    instances = tmp_path / "instances.jsonl"
    instances.write_text("".join(json.dumps(c) + "\n" for c in candidates))
    status = main(["grammar", "check", "--json-schema-file", str(good), str(bad),
                   "--instances", str(instances), "--json-whitespace", "any"])
    lines = _lines(capsys)
    assert status == 2
    assert (
        lines[0]["ok"] is True and lines[0]["kind"] == "json_schema" and lines[0]["compile_ms"] > 0
    )
    verdicts = [line["accepted"] for line in lines[1:1 + len(candidates)]]
    validator = jsonschema.Draft202012Validator(SCHEMA)
    expected = [validator.is_valid(json.loads(c)) and list(json.loads(c)) == ["name", "age"]
                for c in candidates]
    assert verdicts == expected and any(verdicts) and not all(verdicts)
    assert [line["instance"] for line in lines[1 : 1 + len(candidates)]] == list(
        range(len(candidates))
    )
    err = lines[-1]
    assert err["ok"] is False and err["error"]["type"] == "UnsupportedSchema"
    assert err["error"]["pointer"] == "/format"
    # the built-in model's default profile is the 2-space layout (docs/constraint-engines.md)
    layouts = tmp_path / "layouts.jsonl"
    value = {"name": "Ada", "age": 36}
    layouts.write_text(
        json.dumps(json.dumps(value)) + "\n" + json.dumps(json.dumps(value, indent=2))
    )
    main(["grammar", "check", "--json-schema-file", str(good), "--instances", str(layouts)])
    assert [line["accepted"] for line in _lines(capsys)[1:]] == [False, True]


def test_check_batch_many_constraints_in_one_process(tmp_path, capsys) -> None:
    rows = [
        {
            "json_schema": SCHEMA,
            "whitespace": "any",
            "instances": ['{"name": "a", "age": 1}', "{}"],
        },
        {"regex": "[0-9]{3}", "instances": ["123", "12a"]},
        {"choice": ["yes", "no"], "instances": ["no", "maybe"]},
        {"grammar": 'root ::= "a"+', "instances": ["aaa", ""]},
        {"json_object": True, "whitespace": "any", "instances": ["{}", "[]"]},
        {"regex": "(?<=a)b"},
        {"grammar": "root ::= (", "instances": ["x"]},
    ] + [{"regex": f"x{{{n}}}", "instances": ["x" * n]} for n in range(1, 60)]
    batch = tmp_path / "batch.jsonl"
    batch.write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = main(["grammar", "check", "--batch", str(batch)])
    lines = _lines(capsys)
    assert status == 2 and len(lines) == len(rows)
    assert [line.get("accepted") for line in lines[:5]] == [[True, False]] * 5
    assert lines[5]["error"]["type"] == "InvalidRegex"
    assert lines[6]["error"]["type"] == "InvalidGrammar" and lines[6]["error"]["line"] == 1
    assert all(line["ok"] and line["accepted"] == [True] for line in lines[7:])


def test_sample_walks_stay_in_the_language(capsys) -> None:
    status = main(["grammar", "sample", "--choice", "yes", "--choice", "no", "--choice", "",
                   "--n", "12", "--seed", "3"])
    lines = _lines(capsys)
    assert status == 0 and len(lines) == 12
    assert all(line["completed"] and line["text"] in ("yes", "no", "") for line in lines)
    assert len({line["text"] for line in lines}) > 1


def test_serve_and_health_over_loopback() -> None:
    """The real service process answers Health; unreachable addresses exit non-zero."""
    port = free_port()
    env = dict(os.environ, INFERNIX_PORT=str(port), INFERNIX_MODELS="smollm2")
    proc = subprocess.Popen([sys.executable, "-m", "services.cli", "grammar", "serve"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while True:
            health = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "services.cli",
                    "grammar",
                    "health",
                    "--address",
                    f"127.0.0.1:{port}",
                ],
                capture_output=True,
                text=True,
            )
            if health.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert health.returncode == 0, health.stdout
        assert json.loads(health.stdout)["models"] == ["smollm2"]
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    down = subprocess.run([sys.executable, "-m", "services.cli", "grammar", "health", "--address",
                           f"127.0.0.1:{port}"], capture_output=True, text=True)
    assert down.returncode == 1


def test_serve_flags_and_environment_build_the_cache_config(monkeypatch) -> None:
    """'Every setting is an environment variable with the same name as the CLI flag': the
    compile limits, cold slots, isolation and store policy of `grammar serve` come from their
    INFERNIX_* variables, and a flag given on the command line wins."""
    import argparse

    from services.grammar.cache.limits import CompileLimits, StorePolicy
    from services.grammar.cli import add_compile_args, cache_config_from_args

    monkeypatch.setenv("INFERNIX_COMPILE_DEADLINE_S", "7.5")
    monkeypatch.setenv("INFERNIX_COMPILE_MEMORY_BYTES", "123456789")
    monkeypatch.setenv("INFERNIX_COLD_SLOT_WAIT_S", "2.5")
    monkeypatch.setenv("INFERNIX_GRAMMAR_STORE_MIN_SPEEDUP", "0")
    parser = argparse.ArgumentParser()
    add_compile_args(parser, isolation="process")
    config = cache_config_from_args(parser.parse_args(["--max-cold-compiles", "3"]),
                                    cache_bytes=1 << 20)
    assert config.limits == CompileLimits(7.5, 123456789)
    assert (config.slot_wait_s, config.max_cold_compiles, config.isolation) == (2.5, 3, "process")
    assert config.policy.min_speedup == 0 and config.cache_bytes == 1 << 20
    assert config.policy.load_ms_per_mb == StorePolicy().load_ms_per_mb
    with pytest.raises(ValueError):
        cache_config_from_args(parser.parse_args(["--compile-deadline-s", "0"]))
