"""Shared pieces of the OutputSession tests (tests/worker/test_worker_output_session.py and
test_worker_output_lookahead.py): the byte domain, its compiled constraints, and the independent
bases those tests compare against (legal sets enumerated from choice lists, a fresh xgrammar
matcher fed the committed tokens directly)."""

from __future__ import annotations

from functools import lru_cache

import torch
import xgrammar as xgr

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.worker.output.positions import PositionState
from services.worker.output.session import OutputSession
from shared.contract import OutputConstraint
from tests.support.common import byte_domain

R, D, U = PositionState.READY, PositionState.DEAD_END, PositionState.UNREACHABLE
DOMAIN = byte_domain()
EOS = next(iter(DOMAIN.eos_ids))
V = DOMAIN.size
ID = {b: i for i, b in enumerate(DOMAIN.token_bytes) if i not in DOMAIN.special_ids}


@lru_cache(maxsize=None)
def compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(DOMAIN.tokenizer_info(), max_threads=1, cache_enabled=False)


@lru_cache(maxsize=None)
def gbnf(text: str) -> xgr.CompiledGrammar:
    return XgrammarConstraint(compiler().compile_grammar(text), DOMAIN)


@lru_cache(maxsize=None)
def choice(*options: str) -> xgr.CompiledGrammar:
    return ModelCompiler(DOMAIN).compile(OutputConstraint.choice(list(options))).grammar


def toks(data: bytes) -> list[int]:
    """Single-byte tokens of `data` (byte_domain ids 0..255 are the bytes themselves)."""
    return list(data)


def buffer(rows: int) -> torch.Tensor:
    return torch.zeros(rows, DOMAIN.mask_words, dtype=torch.int32)  # [K+1, ceil(V/32)]


def oracle_legal(prefix: bytes, options: tuple[str, ...]) -> set[int]:
    encoded = [o.encode() for o in options]
    legal = {i for i, b in enumerate(DOMAIN.token_bytes)
             if i not in DOMAIN.special_ids and any(c.startswith(prefix + b) for c in encoded)}
    return legal | ({EOS} if prefix in encoded else set())


def fresh_mask(compiled: xgr.CompiledGrammar, committed: list[int]) -> torch.Tensor:
    """The mask after `committed`, from a matcher that never saw a lookahead."""
    m = xgr.GrammarMatcher(compiled.compiled)
    for t in committed:
        assert m.accept_token(t)
    row = buffer(1)
    m.fill_next_token_bitmask(row, 0)
    return row[0]


def commit(session: OutputSession, tokens: list[int]) -> None:
    result = session.preview(tokens)
    assert result.failure is None and result.accepted == len(tokens)
    session.confirm()
