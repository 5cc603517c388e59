"""Every limit of a constraint engine is known at compile time.

Issue: "A string `enum` of 5,000 values compiles; the first accepted token raises inside the
llguidance matcher ("Current row has 5001 items; max is 2000 ...") ... Every limit of either
engine must be known at compile time (refuse typed, or choose the engine that can run it)."
llguidance checks its row limit only when a row is built; `row_items_bound` bounds it statically
and a grammar past the budget compiles on xgrammar, which has no decode-time limit.
"""

from __future__ import annotations

import json

import llguidance as llg
import pytest

from services.grammar.compiler import ModelCompiler, build_lark
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR
from services.grammar.engines.engine_llguidance import (
    MAX_ITEMS_IN_ROW,
    ROW_ITEMS_BUDGET,
    lltokenizer,
    row_items_bound,
)
from shared.contract import OutputConstraint
from shared.generation import FinishReason
from tests.support.common import byte_domain
from tests.support.grammar_process import optional_properties
from tests.support.worker_support import collect, greedy, open_client, text_request, tiny_runtime


def _enum(n: int) -> dict:
    return {"type": "string", "enum": [f"value{i}" for i in range(n)]}


def _llguidance_walk(schema: dict, text: str) -> str | None:
    """llguidance's own error walking `text` byte by byte (None: it walked)."""
    domain = byte_domain()
    lark = build_lark(OutputConstraint.json_schema(schema), domain)
    m = llg.LLMatcher(lltokenizer(domain), llg.LLMatcher.grammar_from_lark(lark), log_level=0)
    for b in text.encode():
        m.consume_token(b)
        if m.is_error():
            return m.get_error()
    return None


@pytest.mark.parametrize("schema, text", [
    (_enum(1500), '"value1'), (_enum(2001), '"value1'),
    (optional_properties(900), '{"field_0899": "x"'),
    (optional_properties(1100), '{"field_1099": "x"'),
])
def test_the_static_row_bound_covers_what_llguidance_builds(schema, text):
    """Checked against the engine itself: a grammar llguidance fails with its row limit has a
    bound past the limit, and one whose bound is within it walks."""
    bound = row_items_bound(build_lark(OutputConstraint.json_schema(schema), byte_domain()))
    error = _llguidance_walk(schema, text)
    if error is not None:
        assert "max is 2000" in error and bound > MAX_ITEMS_IN_ROW, (bound, error[:120])
    else:
        assert bound <= MAX_ITEMS_IN_ROW, bound


def test_a_large_enum_compiles_on_the_engine_that_can_run_it():
    domain = byte_domain()
    compiler = ModelCompiler(domain)
    assert compiler.compile(OutputConstraint.json_schema(_enum(50))).grammar.engine == LLGUIDANCE
    big = compiler.compile(OutputConstraint.json_schema(_enum(5000))).grammar
    assert row_items_bound(build_lark(OutputConstraint.json_schema(_enum(5000)), domain)) \
        > ROW_ITEMS_BUDGET
    assert big.engine == XGRAMMAR
    m = big.matcher()
    for b in json.dumps("value4321").encode():
        assert m.accept_token(b)
    assert m.accept_token(min(domain.eos_ids)) and m.is_terminated()


@pytest.mark.asyncio
async def test_a_five_thousand_value_enum_generates_to_the_end():
    """The issue's request end to end: it completes with one of the values, no engine failure."""
    runtime = tiny_runtime()
    client = open_client(runtime, max_batch=2, max_len=128)
    try:
        constraint = OutputConstraint.json_schema(_enum(5000))
        deltas, done = await collect(client, text_request("enum", "pick:", greedy(
            24, constraint=constraint), runtime.name))
        assert done.error is None and done.finish_reason is FinishReason.STOP
        assert json.loads("".join(deltas)) in _enum(5000)["enum"]
    finally:
        await client.aclose()
