"""Small shared test helpers: a tiny byte-level token domain and mask utilities."""

from __future__ import annotations

from functools import lru_cache

import xgrammar as xgr

from shared.frontends.token_domain import TokenDomain

# Multi-byte tokens that cross JSON punctuation, like real BPE merges do.
_MERGES = (b'{"', b'":', b'",', b'"}', b", ", b": ", b"ab", b"true", b"null", b"  ", b"\n", b'\\"',
           b"\xc3\xa9", b"\xe6\x97", b"10", b"-1", b"0.", b"e+")


@lru_cache(maxsize=1)
def byte_domain() -> TokenDomain:
    """Every single byte (ids 0..255) plus a few merges, EOS, and one control token `<ctl>`.

    Small enough that a matcher's mask lists a few hundred ids, so random walks and enumerations
    are cheap; every string is still reachable byte by byte."""
    tokens = [bytes([b]) for b in range(256)] + list(_MERGES) + [b"<eos>", b"<ctl>"]
    eos = len(tokens) - 2
    ctl = len(tokens) - 1
    return TokenDomain(
        name="bytes-test",
        token_bytes=tuple(tokens),
        size=len(tokens) + 5,  # padding rows, as real embeddings have
        eos_ids=frozenset({eos}),
        control_ids=frozenset({ctl}),
        special_names=(("<eos>", eos), ("<ctl>", ctl)),
    )


def language(compiled: xgr.CompiledGrammar, alphabet: str | list[str], max_len: int) -> set[str]:
    """Every string over `alphabet` of at most `max_len` characters the matcher completes,
    by DFS over byte tokens (token id = byte value in the byte domain) with rollback."""
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=False)
    found: set[str] = set()

    def walk(prefix: str) -> None:
        if matcher.is_completed():
            found.add(prefix)
        if len(prefix) == max_len:
            return
        for ch in alphabet:
            accepted = 0
            for byte in ch.encode():
                if not matcher.accept_token(byte):
                    break
                accepted += 1
            else:
                walk(prefix + ch)
            if accepted:
                matcher.rollback(accepted)

    walk("")
    return found
