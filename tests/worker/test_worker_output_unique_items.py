"""The unique-items companion in the worker's mask path: lookahead and its K+1 masks, the
batched ordinary fill (program/masks.py), rollback, and a continuation prefix."""

from __future__ import annotations

import asyncio

import torch

from services.grammar.client import in_process_client, json_names_for, unique_items_for
from services.worker.output.session import OutputSession
from services.worker.program.masks import MaskBuffers
from shared.contract import OutputConstraint
from tests.support.common import byte_domain

# Strings of at most one character, unique: the grammar alone lets `"a"` repeat.
TAGS = OutputConstraint.json_schema({"type": "array", "uniqueItems": True,
                                     "items": {"type": "string", "maxLength": 1}},
                                    whitespace="any")


def _session(constraint, *, items=True, prefix=b""):
    d = byte_domain()
    grammar = asyncio.run(in_process_client({"x": d}).compile(constraint, model="x")).grammar
    return OutputSession(d, grammar, prefix=prefix, names=json_names_for(constraint, d),
                         items=unique_items_for(constraint, d) if items else None)


def _commit(session, data: bytes):
    session.preview(list(data))  # byte_domain: token id b is byte b
    session.confirm()


def _legal(row, t: int) -> bool:
    return bool((int(row[t >> 5]) >> (t & 31)) & 1)


def _mask(session):
    row = torch.zeros(1, byte_domain().mask_words, dtype=torch.int32)
    session.lookahead((), row)
    return row[0]


def test_lookahead_clears_a_repeated_item_the_grammar_allows():
    """uniqueItems: after `["a","`, the byte `a` leaves only `"` (a repeat) within maxLength 1:
    the companion clears `a` there, and `"` after `a` once read; without it both are legal."""
    with_items, bare = _session(TAGS), _session(TAGS, items=False)
    for s in (with_items, bare):
        _commit(s, b'["a","')
    a = ord("a")
    assert _legal(_mask(bare), a) and not _legal(_mask(with_items), a)
    assert _legal(_mask(with_items), ord("b"))


def test_speculative_masks_match_step_by_step_and_roll_back():
    """Section 7: the K+1 masks are those after committed + drafts[:i]; the draft that repeats an
    item is illegal at its position, and the companion is back at the committed state after."""
    s = _session(TAGS)
    _commit(s, b'["a",')
    before = _mask(s)
    drafts = list(b'"a"')
    out = torch.zeros(len(drafts) + 1, byte_domain().mask_words, dtype=torch.int32)
    result = s.lookahead(drafts, out)
    assert result.illegal_at == 1
    assert torch.equal(out[0], before) and not _legal(out[1], ord("a"))
    assert torch.equal(_mask(s), before)


def test_batched_fill_and_continuation_prefix():
    """The batched ordinary fill clears each row with its own companion; a continuation prefix's
    items cannot be generated again."""
    sessions = [_session(TAGS), _session(TAGS, items=False), _session(TAGS, prefix=b'["b","')]
    for s in sessions[:2]:
        _commit(s, b'["a","')
    buffers = MaskBuffers(byte_domain(), 3, 0, torch.device("cpu"))
    buffers.fill_ordinary(sessions, [6, 6, 0])
    rows = buffers.host[:, 0]
    a, b = ord("a"), ord("b")
    assert not _legal(rows[0], a) and _legal(rows[1], a)
    assert not _legal(rows[2], b) and _legal(rows[2], a)
    for j, s in enumerate(sessions):
        assert torch.equal(rows[j], _mask(s))
