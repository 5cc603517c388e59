"""Engine end to end with the real built-in model (SmolLM2-135M-Instruct on the CPU) and the CLI."""

from __future__ import annotations

import argparse
import asyncio
import io
import json

import jsonschema
import pytest

from services.worker.cli import add_generate_parser, run_generate
from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.generation import ChatMessage, GenerateRequest, PromptInput
from tests.support.worker_support import collect, greedy, open_client

SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}},
          "required": ["answer"], "additionalProperties": False}


@pytest.fixture(scope="module")
def runtime():
    return load_runtime()


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_generate_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["generate", *argv])


def test_cli_json_schema_output_is_schema_valid(runtime, tmp_path):
    """Design: content constraints are enforced token by token; a normal completion is
    "complete" and "terminated" in the constraint report. `infernix generate --json-schema-file`
    with the real model prints JSON that the `jsonschema` library accepts."""
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    args = parse(["--prompt", "What is 2+2? Reply in JSON.", "--json-schema-file", str(path),
                  "--temperature", "0", "--max-tokens", "40", "--max-len", "256", "--json"])
    out, err = io.StringIO(), io.StringIO()
    assert run_generate(args, out, err, runtime=runtime) == 0, err.getvalue()
    result = json.loads(out.getvalue())
    jsonschema.validate(json.loads(result["content"]), SCHEMA)
    assert result["finish_reason"] == "stop"
    assert result["constraint"]["complete"] and result["constraint"]["terminated"]


@pytest.mark.asyncio
async def test_choice_and_greedy_determinism(runtime):
    """A choice constraint yields exactly one of its literals; greedy decoding of the same request
    twice (batched together) is identical."""
    client = open_client(runtime, max_batch=3, max_len=256)
    colour = PromptInput(messages=(ChatMessage("user", "Name a colour."),))
    story = PromptInput(messages=(ChatMessage("user", "Say hello."),))
    choices = ["red", "green", "blue"]
    try:
        results = await asyncio.gather(
            collect(
                client,
                GenerateRequest(
                    "c", colour, greedy(8, constraint=OutputConstraint.choice(choices))
                ),
            ),
            collect(client, GenerateRequest("g1", story, greedy(8))),
            collect(client, GenerateRequest("g2", story, greedy(8))),
        )
    finally:
        await client.aclose()
    (_, chosen), (_, first), (_, second) = results
    assert chosen.content in choices and chosen.finish_reason.value == "stop"
    assert first.content == second.content
    # equal counts; how much of the prompt the prefix cache held depends on admission order
    assert (first.usage.prompt_tokens, first.usage.completion_tokens) == \
        (second.usage.prompt_tokens, second.usage.completion_tokens)
    assert first.usage.completion_tokens >= 1
