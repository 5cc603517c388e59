"""A small byte-level token domain with the Qwen3.5 framing control tokens, for tool and thinking
grammars that name control tokens by id (walks over it are cheap; the real vocabulary is used
where its merges matter)."""

from __future__ import annotations

from functools import lru_cache

from shared.frontends.token_domain import TokenDomain

CONTROLS = ("<|im_start|>", "<tool_call>", "</tool_call>", "<think>", "</think>")
_MERGES = (b"<parameter=", b"</parameter>\n", b">\n", b"\n\n", b"\n<", b"</function>", b"ab",
           b'{"', b'":', b", ", b"true", b"10", b"\n</param", b"eter>", b"city>\nPar", b"\xc3\xa9",
           b"\xe6\x97")


@lru_cache(maxsize=1)
def xml_domain() -> TokenDomain:
    """Every single byte (ids 0..255), a few merges that cross the XML framing, EOS
    `<|im_end|>` and the framing control tokens."""
    tokens = [bytes([b]) for b in range(256)] + list(_MERGES)
    eos = len(tokens)
    tokens.append(b"<|im_end|>")
    specials = {"<|im_end|>": eos}
    for spelling in CONTROLS:
        specials[spelling] = len(tokens)
        tokens.append(spelling.encode())
    return TokenDomain(
        name="xml-test",
        token_bytes=tuple(tokens),
        size=len(tokens) + 3,
        eos_ids=frozenset({eos}),
        control_ids=frozenset(i for s, i in specials.items() if s != "<|im_end|>"),
        special_names=tuple(sorted(specials.items(), key=lambda kv: kv[1])),
    )


@lru_cache(maxsize=1)
def qwen_compiler():
    """One xgrammar compiler over the real Qwen3.5 vocabulary for every test module (its
    vocabulary index takes about a second to build)."""
    import xgrammar as xgr

    from shared.frontends.qwen35 import qwen35_domain

    return xgr.GrammarCompiler(qwen35_domain().tokenizer_info(), max_threads=1,
                               cache_enabled=False)


def ordinary_ids(text: str) -> list[int]:
    """`text` in ordinary Qwen3.5 tokens (special-token spellings stay text)."""
    from shared.frontends.qwen35 import qwen35_tokenizer

    return qwen35_tokenizer()._tokenizer.encode_ordinary(text)
