"""The xgrammar engine behind `services.grammar.engines.engine`'s interface.

A `CompiledGrammar` compiled against `TokenDomain.tokenizer_info()` (the domain's explicit special
classes: EOS as stop tokens, control tokens reachable only by Token(id), never-generable ids with
no bytes) becomes an `XgrammarConstraint`; its matchers stop on the domain's EOS ids. xgrammar may
set mask bits past the domain size; `fill_mask` clears them.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import torch
import xgrammar as xgr

from services.grammar.engines.engine import (
    XGRAMMAR,
    CompiledConstraint,
    Matcher,
    buffer_address,
    check_mask_buffer,
    lookahead_extent,
)
from shared.errors import InternalError
from shared.frontends.token_domain import TokenDomain

TAG = XGRAMMAR + "\n"


@lru_cache(maxsize=16)
def _tail_word(size: int) -> int:
    bits = size - 32 * ((size - 1) // 32)
    word = (1 << bits) - 1
    return word - (1 << 32) if word >= 1 << 31 else word  # as a signed int32


def _as_tensor(out: Any) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else torch.from_numpy(out)


class XgrammarMatcher(Matcher):
    engine = XGRAMMAR

    def __init__(self, constraint: "XgrammarConstraint") -> None:
        self.domain = constraint.domain
        stops = sorted(constraint.domain.eos_ids) or None
        self._m = xgr.GrammarMatcher(constraint.compiled, override_stop_tokens=stops)
        self._accepted = 0  # tokens rollback may undo

    def accept_token(self, token: int) -> bool:
        if not 0 <= token < self.domain.size:
            return False
        if self._m.accept_token(token):
            self._accepted += 1
            return True
        return False

    def accept_bytes(self, data: bytes) -> bool:
        return not data or self._m.accept_string(bytes(data))

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self._accepted:
            raise InternalError(f"rollback({n}) with {self._accepted} tokens accepted")
        if n:
            self._m.rollback(n)
            self._accepted -= n

    def fill_mask(self, out: Any, row: int = 0) -> None:
        check_mask_buffer(out, self.domain)
        buffer_address(out, row)  # bounds check
        t = _as_tensor(out)
        self._m.fill_next_token_bitmask(t, row)
        t[row, -1] &= _tail_word(self.domain.size)

    def fill_lookahead(self, drafts: Sequence[int], out: Any, row: int = 0) -> int:
        check_mask_buffer(out, self.domain)
        k = len(drafts)
        buffer_address(out, row + k)  # bounds check
        if self.is_terminated():
            raise InternalError("lookahead after the output ended")
        t = _as_tensor(out)
        chain = t[row:row + k + 1]  # [k+1, ceil(V/32)], contiguous rows
        nxt = torch.arange(1, k + 2, dtype=torch.int64)
        nxt[k] = -1
        sibling = torch.full((k + 1,), -1, dtype=torch.int64)
        tokens = torch.tensor([0, *[int(d) for d in drafts]], dtype=torch.int64)
        self._m.traverse_draft_tree(nxt, sibling, tokens, chain)
        chain[:, -1] &= _tail_word(self.domain.size)
        return lookahead_extent(t, row, drafts, self.domain)

    def forced_bytes(self) -> bytes:
        if self._m.is_terminated():
            return b""
        try:
            return self._m.find_jump_forward_string().encode("utf-8")
        except UnicodeDecodeError as exc:  # the binding decodes the forced bytes as UTF-8, which
            return bytes(exc.object)  # fails when they end inside a character: the raw bytes

    def is_completed(self) -> bool:
        return self._m.is_completed()

    def is_terminated(self) -> bool:
        return self._m.is_terminated()


class XgrammarConstraint(CompiledConstraint, xgr.CompiledGrammar):
    """Transitional: it is also the xgrammar `CompiledGrammar` it wraps (same handle), so code that
    still builds `xgr.GrammarMatcher` from a compiled grammar (today's OutputSession) keeps
    working until it uses `matcher()`; drop the second base class then."""

    engine = XGRAMMAR

    def __init__(self, grammar: xgr.CompiledGrammar, domain: TokenDomain) -> None:
        vocab = grammar.tokenizer_info.vocab_size
        if vocab != domain.size:
            raise InternalError(f"grammar compiled for {vocab} token ids, domain has {domain.size}")
        self._init_handle(grammar._handle)
        self.compiled = grammar
        self.domain = domain

    def matcher(self) -> XgrammarMatcher:
        return XgrammarMatcher(self)

    @property
    def memory_size_bytes(self) -> int:
        return int(self.compiled.memory_size_bytes)

    def serialize_json(self) -> str:
        return TAG + self.compiled.serialize_json()


def load(text: str, domain: TokenDomain, info: xgr.TokenizerInfo) -> XgrammarConstraint:
    """The constraint of `serialize_json`'s text (tag line already checked by the caller)."""
    return XgrammarConstraint(xgr.CompiledGrammar.deserialize_json(text[len(TAG):], info), domain)


def batch_pool(max_threads: int | str) -> xgr.BatchGrammarMatcher:
    return xgr.BatchGrammarMatcher(max_threads=max_threads)


def batch_fill(pool: xgr.BatchGrammarMatcher, matchers: Sequence[Matcher], out: Any,
               rows: Sequence[int]) -> None:
    if not matchers:
        return
    domain = matchers[0].domain  # type: ignore[attr-defined]
    check_mask_buffer(out, domain)
    for r in rows:
        buffer_address(out, r)
    t = _as_tensor(out)
    pool.batch_fill_next_token_bitmask([m._m for m in matchers], t, list(rows))  # type: ignore[attr-defined]
    tail = _tail_word(domain.size)
    for r in rows:
        t[r, -1] &= tail
