"""The JSON length companion in the worker's mask path: lookahead and its K+1 masks,
preview/discard rollback, the batched ordinary fill (program/masks.py), a continuation prefix, and
the engine end to end on the built-in SmolLM2.

JSON Schema: a string is valid against maxLength if its length (characters) is at most the value,
and against minLength if at least. Where the compiled grammar writes a counted string unbounded
(schema/lengths.py) only the companion keeps those bounds, so every path that fills a mask or
moves the matcher must carry it.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from services.grammar.client import in_process_client, json_lengths_for
from services.worker.output.session import OutputSession
from services.worker.program.masks import MaskBuffers
from shared.contract import OutputConstraint
from tests.support.common import byte_domain

SCHEMA = {"type": "object", "properties": {"t": {"type": "string", "minLength": 1,
                                                 "maxLength": 2}},
          "required": ["t"], "additionalProperties": False}
BOUNDED = OutputConstraint.json_schema(SCHEMA, whitespace="compact")


def _compiled(constraint):
    return asyncio.run(in_process_client({"x": byte_domain()}).compile(
        constraint, model="x")).grammar


def _session(*, lengths=True, prefix=b""):
    d = byte_domain()
    return OutputSession(d, _compiled(BOUNDED), prefix=prefix,
                         lengths=json_lengths_for(BOUNDED, d) if lengths else None)


def _commit(session, data: bytes):
    session.preview(list(data))  # byte_domain: token id b is byte b
    session.confirm()


def _legal(row, t: int) -> bool:
    return bool((int(row[t >> 5]) >> (t & 31)) & 1)


def _mask(session):
    row = torch.zeros(1, byte_domain().mask_words, dtype=torch.int32)
    session.lookahead((), row)
    return row[0]


def test_the_compiled_grammar_leaves_the_bound_to_the_companion():
    """The product's grammar alone lets a third character in (the string is written unbounded);
    with the companion the third is illegal, and the closing quote is illegal before the first."""
    with_lengths, bare = _session(), _session(lengths=False)
    for s in (with_lengths, bare):
        _commit(s, b'{"t":"ab')
    assert _legal(_mask(bare), ord("c")) and not _legal(_mask(with_lengths), ord("c"))
    assert _legal(_mask(with_lengths), ord('"'))
    empty = _session()
    _commit(empty, b'{"t":"')
    assert not _legal(_mask(empty), ord('"')) and _legal(_mask(empty), ord("a"))


def test_speculative_masks_match_step_by_step_masks_and_roll_back():
    """Section 7: the K+1 masks of a lookahead are the masks after committed + drafts[:i]; a
    draft past the bound is illegal there, and the companion is back at the committed state
    afterwards."""
    s = _session()
    _commit(s, b'{"t":"')
    before = _mask(s)
    drafts = list(b"abc")
    out = torch.zeros(len(drafts) + 1, byte_domain().mask_words, dtype=torch.int32)
    result = s.lookahead(drafts, out)
    assert result.illegal_at == 2
    step = _session()
    _commit(step, b'{"t":"')
    for i in range(2):
        assert torch.equal(out[i], _mask(step))
        _commit(step, bytes([drafts[i]]))
    assert torch.equal(_mask(s), before)
    s.preview(list(b"ab"))
    s.discard()
    assert torch.equal(_mask(s), before)


def test_batched_fill_applies_the_companion_to_each_row():
    sessions = [_session(), _session(lengths=False)]
    for s in sessions:
        _commit(s, b'{"t":"ab')
    buffers = MaskBuffers(byte_domain(), 2, 0, torch.device("cpu"))
    fill = buffers.fill_ordinary(sessions, [8, 8])
    assert not fill.dead_ends
    rows = buffers.host[:, 0]
    assert not _legal(rows[0], ord("c")) and _legal(rows[1], ord("c"))
    assert torch.equal(rows[0], _mask(sessions[0]))


def test_continuation_prefix_moves_the_companion():
    """A continuation prefix is taken as bytes: its characters count."""
    s = _session(prefix=b'{"t":"ab')
    assert not _legal(_mask(s), ord("c")) and _legal(_mask(s), ord('"'))


@pytest.mark.asyncio
async def test_smollm2_outputs_keep_the_bounds():
    """End to end on the built-in model (prepare.py wires the companion for content JSON): every
    output's string holds 1..2 characters."""
    from services.worker.runtime import load_runtime
    from shared.generation import (
        ChatMessage,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )
    from tests.support.worker_support import collect, open_client

    runtime = load_runtime()
    client = open_client(runtime, max_batch=2, max_len=256)
    prompt = PromptInput(messages=(ChatMessage("user", "Write a long sentence as JSON."),))
    try:
        results = await asyncio.gather(*[
            collect(client, GenerateRequest(f"r{seed}", prompt, RequestOptions(
                max_tokens=40, constraint=OutputConstraint.json_schema(SCHEMA),
                sampling=SamplingParams(temperature=1.0, seed=seed)), runtime.name))
            for seed in range(2)])
    finally:
        await client.aclose()
    for _, result in results:  # the object closes within a few tokens, then only EOS is legal
        assert result.finish_reason.value == "stop", result.content
        assert 1 <= len(json.loads(result.content)["t"]) <= 2, result.content
