"""Grammar drafts with the real built-in model (SmolLM2-135M-Instruct on the CPU).

Issue rule: "Greedy equality with plain decoding: 100%". DESIGN.md, "Speculation": "At
temperature 0 speculative output is token-identical to plain decoding". Independent base: the
same engine without speculation; the schemas' own validator for the outputs that completed.
"""

from __future__ import annotations

import asyncio
import json

import jsonschema
import pytest

from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint
from shared.generation import ChatMessage, GenerateRequest, PromptInput
from tests.support.worker_support import collect, greedy, open_client

SCHEMAS = {
    "order": ({"type": "object", "properties": {
        "id": {"type": "string"}, "customer": {"type": "string"},
        "status": {"enum": ["pending", "shipped", "delivered_to_neighbour"]}},
        "required": ["id", "customer", "status"], "additionalProperties": False},
        'Rewrite this JSON object exactly, but set status to "shipped":\n'
        '{"id": "B-55120", "customer": "John Carter", "status": "pending"}'),
    "answer": ({"type": "object", "properties": {"answer": {"type": "integer"},
                                                 "unit_of_measurement": {"type": "string"}},
                "required": ["answer", "unit_of_measurement"], "additionalProperties": False},
               "How many legs does a spider have? Reply in JSON."),
    "tags": ({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
             "List two colours of the French flag that are in this list: red, green, blue."),
}


@pytest.fixture(scope="module")
def runtime():
    return load_runtime()


async def _run(runtime, speculative):
    config = {"speculative": speculative, "num_draft_tokens": 4} if speculative else {}
    client = open_client(runtime, max_batch=len(SCHEMAS), max_len=512, **config)
    tokens = {}
    client.engine.finish_listeners.append(
        lambda job: tokens.__setitem__(job.request_id, tuple(job.output_ids)))
    try:
        results = await asyncio.gather(*(collect(client, GenerateRequest(
            name, PromptInput(messages=(ChatMessage("user", prompt),)),
            greedy(48, constraint=OutputConstraint.json_schema(schema)), model=runtime.name))
            for name, (schema, prompt) in SCHEMAS.items()))
        return tokens, [fin for _, fin in results], client.engine.speculation
    finally:
        await client.aclose()


@pytest.fixture(scope="module")
def plain(runtime):
    """The tokens of plain greedy decoding (no speculation), decoded once for both backends."""
    tokens, _, _ = asyncio.run(_run(runtime, None))
    return tokens


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["grammar", "ngram"])
def test_greedy_with_grammar_drafts_is_plain_greedy(runtime, plain, backend):
    spec_tokens, spec_fins, spec = asyncio.run(_run(runtime, backend))
    assert spec_tokens == plain
    assert spec.accepted >= 8  # the forced keys and layout were drafted and accepted
    for fin, (name, (schema, _)) in zip(spec_fins, SCHEMAS.items()):
        if fin.finish_reason.value == "stop":
            jsonschema.validate(json.loads(fin.content), schema)
