"""The JSON name companion in the worker's mask path: lookahead and its speculative K+1 masks, the
batched ordinary fill (program/masks.py), preview/discard rollback, a continuation prefix, and the
engine end to end on the built-in SmolLM2."""

from __future__ import annotations

import asyncio

import pytest
import torch

from services.grammar.client import in_process_client, json_names_for
from services.grammar.json_text import repeats_a_name
from services.worker.output.session import OutputSession
from services.worker.program.masks import MaskBuffers
from shared.contract import OutputConstraint
from tests.support.common import byte_domain

# Names may be any string, so without the companion the grammar lets `"a"` repeat.
OPEN = OutputConstraint.json_schema({"type": "object", "minProperties": 2,
                                     "additionalProperties": {"type": "integer"}},
                                    whitespace="any")
# Only "a" and "b" are names: after both, `,` has no completion.
FINITE = OutputConstraint.json_schema({"type": "object", "propertyNames": {"enum": ["a", "b"]},
                                       "additionalProperties": {"const": 1}}, whitespace="any")


def _compiled(constraint):
    return asyncio.run(in_process_client({"x": byte_domain()}).compile(
        constraint, model="x")).grammar


def _session(constraint, *, names=True, prefix=b""):
    d = byte_domain()
    return OutputSession(d, _compiled(constraint), prefix=prefix,
                         names=json_names_for(constraint, d) if names else None)


def _commit(session, data: bytes):
    session.preview(list(data))  # byte_domain: token id b is byte b
    session.confirm()


def _legal(row, t: int) -> bool:
    return bool((int(row[t >> 5]) >> (t & 31)) & 1)


def _mask(session):
    row = torch.zeros(1, byte_domain().mask_words, dtype=torch.int32)
    session.lookahead((), row)
    return row[0]


def test_lookahead_clears_a_repeated_name_that_the_grammar_allows():
    """Design: no generated object repeats a member name. After `{"a":1,"`, the byte `a` then
    `"` would repeat `a`: the token `"` is illegal once `a` is read with the companion and legal
    without; a name spelled with an escape is read unescaped, so its repeat is refused too."""
    with_names, bare = _session(OPEN), _session(OPEN, names=False)
    for s in (with_names, bare):
        _commit(s, b'{"a":1,"a')
    quote = ord('"')
    assert _legal(_mask(bare), quote) and not _legal(_mask(with_names), quote)
    assert _legal(_mask(with_names), ord("b"))  # a longer name stays legal
    escaped = _session(OPEN)  # the grammar spells U+001F only as \u001f
    _commit(escaped, b'{"\\u001f":1,"\\u001')
    assert _legal(_mask(escaped), ord("e"))
    _commit(escaped, b"f")
    assert not _legal(_mask(escaped), quote)


def test_speculative_masks_match_step_by_step_masks_and_roll_back():
    """Section 7: the K+1 masks of a lookahead are the masks after committed + drafts[:i]; a
    draft that repeats a name is illegal there (the walk stops), and the companion is back at the
    committed state afterwards (the next mask is unchanged)."""
    s = _session(OPEN)
    _commit(s, b'{"a":1,')
    before = _mask(s)
    drafts = list(b'"a"')
    out = torch.zeros(len(drafts) + 1, byte_domain().mask_words, dtype=torch.int32)
    result = s.lookahead(drafts, out)
    assert result.illegal_at == 2  # `"` after `"a` would repeat a
    step = _session(OPEN)
    _commit(step, b'{"a":1,')
    for i in range(2):
        assert torch.equal(out[i], _mask(step))
        _commit(step, bytes([drafts[i]]))
    assert torch.equal(_mask(s), before)
    # a preview that is discarded leaves the companion where the matcher is
    s.preview(list(b'"b":2,'))
    s.discard()
    assert torch.equal(_mask(s), before)


def test_batched_fill_applies_the_companion_to_each_row():
    """program/masks.py's batched ordinary fill: each row gets its own companion's clearing (the
    finite name set: after `"a"` and `"b"` a `,` has no completion, so only the closer is left),
    the row without a companion keeps the grammar's mask."""
    sessions = [_session(FINITE), _session(FINITE, names=False), _session(OPEN)]
    for s in sessions[:2]:
        _commit(s, b'{"a":1,"b":1')
    _commit(sessions[2], b'{"a":1,"a')
    buffers = MaskBuffers(byte_domain(), 3, 0, torch.device("cpu"))
    fill = buffers.fill_ordinary(sessions, [12, 12, 9])
    assert not fill.dead_ends
    rows = buffers.host[:, 0]
    comma, close, quote = ord(","), ord("}"), ord('"')
    assert not _legal(rows[0], comma) and _legal(rows[0], close)
    assert _legal(rows[1], comma)
    assert not _legal(rows[2], quote)
    for j, s in enumerate(sessions):
        assert torch.equal(rows[j], _mask(s))  # the same as a single lookahead


def test_continuation_prefix_moves_the_companion():
    """A ContinueFinalAssistant prefix is accepted as bytes by the matcher and followed by the
    companion: a name in the prefix cannot be generated again."""
    s = _session(OPEN, prefix=b'{"a":1,"a')
    assert not _legal(_mask(s), ord('"'))


@pytest.mark.asyncio
async def test_smollm2_never_repeats_a_name_where_only_one_name_exists():
    """End to end on the built-in model (prepare.py wires the companion for content JSON):
    propertyNames const "a" lets the grammar alone go on with `, "a": 1` forever; with the
    companion every sampled output is one member, closed."""
    import json

    from services.worker.runtime import load_runtime
    from shared.generation import (
        ChatMessage,
        GenerateRequest,
        PromptInput,
        RequestOptions,
        SamplingParams,
    )
    from tests.support.worker_support import collect, open_client

    schema = {"type": "object", "propertyNames": {"const": "a"},
              "additionalProperties": {"type": "integer"}}
    runtime = load_runtime()
    client = open_client(runtime, max_batch=2, max_len=256)
    prompt = PromptInput(messages=(ChatMessage("user", "Write a JSON object with many keys."),))
    try:
        results = await asyncio.gather(*[
            collect(client, GenerateRequest(f"r{seed}", prompt, RequestOptions(
                max_tokens=40, constraint=OutputConstraint.json_schema(schema),
                sampling=SamplingParams(temperature=1.0, seed=seed)), runtime.name))
            for seed in range(2)])
    finally:
        await client.aclose()
    for _, result in results:
        text = result.content.encode()
        assert not repeats_a_name(text), text
        if result.finish_reason.value == "stop":
            assert set(json.loads(text)) <= {"a"}
