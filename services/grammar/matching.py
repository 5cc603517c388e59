"""Walking a compiled grammar with a matcher: whole-output acceptance and random legal walks.

Used by the CLI (`grammar check --instances`, `grammar sample`), the benchmark and the tests. These
are the same matcher operations the worker performs per token, run on the CPU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
import xgrammar as xgr

from shared.frontends.token_domain import TokenDomain


def accepts(compiled: xgr.CompiledGrammar, output: str | bytes) -> bool:
    """True when `output` is a complete output of the language (EOS would be legal after it)."""
    data = output.encode("utf-8") if isinstance(output, str) else output
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    if data and not matcher.accept_string(data):
        return False
    return matcher.is_completed()


def legal_ids(mask_row: torch.Tensor, size: int) -> list[int]:
    """Token ids whose bit is set in one packed mask row (bit i of word w = token 32w+i)."""
    words = mask_row.to(torch.int64) & 0xFFFFFFFF
    bits = (words.unsqueeze(-1) >> torch.arange(32, dtype=torch.int64)) & 1
    ids = torch.nonzero(bits.flatten()).flatten()
    return [int(i) for i in ids if i < size]


@dataclass(frozen=True)
class Walk:
    text: str  # decoded with replacement only for display; `data` holds the exact bytes
    data: bytes
    completed: bool  # ended by EOS where the language may end
    tokens: int
    dead_end: bool = False


def random_walk(
    compiled: xgr.CompiledGrammar,
    domain: TokenDomain,
    rng: random.Random,
    *,
    max_tokens: int = 256,
    end_bias: float = 0.5,
) -> Walk:
    """Pick uniformly random legal tokens until EOS or `max_tokens`.

    End bias: when EOS is legal, it is taken with probability `end_bias` before a uniform draw over
    the other legal tokens (a uniform draw alone almost never ends a JSON walk, and always ending at
    the first chance would only ever produce the shortest outputs).
    """
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain.size)
    data = bytearray()
    for step in range(max_tokens):
        matcher.fill_next_token_bitmask(mask)
        ids = legal_ids(mask[0], domain.size)
        if not ids:
            return Walk(data.decode("utf-8", "replace"), bytes(data), False, step, dead_end=True)
        eos = [i for i in ids if i in domain.eos_ids]
        other = [i for i in ids if i not in domain.eos_ids]
        if eos and (not other or rng.random() < end_bias):
            ok = matcher.accept_token(eos[0])
            assert ok, "a legal EOS was refused"
            return Walk(data.decode("utf-8", "replace"), bytes(data), True, step + 1)
        token = rng.choice(other)
        ok = matcher.accept_token(token)
        assert ok, f"legal token {token} was refused"
        data += domain.token_bytes[token]
    return Walk(data.decode("utf-8", "replace"), bytes(data), False, max_tokens)
