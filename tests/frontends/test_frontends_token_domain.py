"""Token domains of the two built-in vocabularies, checked against independent tokenizers.

Design document: "ordinary text tokens match by their bytes"; "padding, invalid ids and vision-only
tokens that cannot be generated are not ordinary text candidates"; "EOS is a completion control";
"an ordinary token spelling and a special token with the same visible string are handled
separately"; "Infernix supplies these classes explicitly".
"""

from __future__ import annotations

import os
import random

import pytest
import xgrammar as xgr

from services.grammar.engines.matching import legal_ids
from shared.frontends import get_domain
from shared.frontends.token_domain import TokenDomain

TEXTS = [
    'Hello world 12345 {"a": 1, "b": [true, null]}',
    "  leading spaces\n\n\ttabs and\r\nCRLF",
    "naïve café 日本語 🙂 Ünïcödé",
    "x=1000000; y = [1,2,3]; z = 3.14159e-10",
]


@pytest.fixture(scope="module")
def smollm2() -> TokenDomain:
    return get_domain("smollm2")


@pytest.fixture(scope="module")
def qwen() -> TokenDomain:
    return get_domain("qwen3.5")


def _first_mask(domain: TokenDomain, ebnf: str) -> set[int]:
    compiler = xgr.GrammarCompiler(domain.tokenizer_info(), max_threads=1, cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar(ebnf))
    mask = xgr.allocate_token_bitmask(1, domain.size)
    matcher.fill_next_token_bitmask(mask)
    return set(legal_ids(mask[0], domain.size))


def test_smollm2_shape(smollm2: TokenDomain) -> None:
    """SmolLM2: 49,152 tokens; <|im_end|> and <|endoftext|> end a reply; <|im_start|> is control."""
    assert smollm2.size == len(smollm2.token_bytes) == 49152
    assert smollm2.eos_ids == {
        smollm2.special_id("<|im_end|>"),
        smollm2.special_id("<|endoftext|>"),
    }
    assert smollm2.special_id("<|im_start|>") in smollm2.control_ids


def test_smollm2_bytes_match_transformers_tokenizer(smollm2: TokenDomain) -> None:
    """Each ordinary token's bytes are what an independent tokenizer (transformers reading the same
    GGUF) decodes it to, and our tokenizer encodes text exactly as that one does."""
    from transformers import AutoTokenizer

    from shared.frontends.smollm2 import gguf_path, smollm2_tokenizer

    path = gguf_path()
    oracle = AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))
    ours = smollm2_tokenizer()
    for text in TEXTS + ["<|im_start|>user\nhi<|im_end|>\n"]:
        ids = oracle.encode(text, add_special_tokens=False)
        assert ours.encode(text).ids == ids
        assert b"".join(smollm2.token_bytes[i] for i in ids) == text.encode()
    checked = 0
    for i in range(smollm2.size):
        if not smollm2.is_ordinary(i):
            continue
        try:
            text = smollm2.token_bytes[i].decode("utf-8")
        except UnicodeDecodeError:
            continue  # partial UTF-8 pieces have no standalone text to compare
        assert oracle.decode([i]) == text, i
        checked += 1
    assert checked > 45000


def test_qwen_shape(qwen: TokenDomain) -> None:
    """Qwen3.5: 248,077 tokens in a 248,320-row embedding; the control ids of DESIGN.md."""
    assert len(qwen.token_bytes) == 248077 and qwen.size == 248320
    assert qwen.special_id("<tool_call>") == 248058
    assert qwen.special_id("<think>") == 248068 and qwen.special_id("</think>") == 248069
    assert qwen.special_id("<|im_end|>") == 248046 and 248046 in qwen.eos_ids
    assert {248058, 248068, 248069} <= qwen.control_ids
    assert qwen.special_id("<|image_pad|>") in qwen.never_ids


def test_qwen_bytes_match_tiktoken(qwen: TokenDomain) -> None:
    """Every ordinary id's bytes equal tiktoken's own decoding of that id, and encoded text
    concatenates back to its bytes."""
    from shared.frontends.qwen35 import qwen35_tokenizer

    enc = qwen35_tokenizer()._tokenizer  # the package's tiktoken Encoding
    rng = random.Random(0)
    for i in rng.sample(range(248044), 5000) + list(range(256)):
        assert enc.decode_single_token_bytes(i) == qwen.token_bytes[i]
    for text in TEXTS:
        ids = enc.encode(text)
        assert b"".join(qwen.token_bytes[i] for i in ids) == text.encode()


@pytest.mark.parametrize("which", ["smollm2", "qwen"])
def test_control_tokens_are_never_content(which: str, request: pytest.FixtureRequest) -> None:
    """A grammar that accepts any text never offers a control, never-generable or padding id; EOS
    is offered only because the language may end there."""
    domain: TokenDomain = request.getfixturevalue(which)
    anything = _first_mask(domain, r"root ::= [\u0000-\U0010FFFF]*")
    assert not anything & domain.control_ids
    assert not anything & domain.never_ids
    assert all(i < len(domain.token_bytes) for i in anything)
    assert domain.eos_ids <= anything
    must_continue = _first_mask(domain, r'root ::= [a-z]+ "."')
    assert not must_continue & domain.eos_ids


@pytest.mark.parametrize("which,spelling", [("smollm2", "<|im_start|>"), ("qwen", "<tool_call>")])
def test_special_token_and_spelling_stay_distinct(which: str, spelling: str,
                                                  request: pytest.FixtureRequest) -> None:
    """Content that spells a special token's text is matched by ordinary tokens only, while a
    framing rule naming the token by id reaches exactly that id."""
    domain: TokenDomain = request.getfixturevalue(which)
    special = domain.special_id(spelling)
    literal = _first_mask(domain, f'root ::= "{spelling}"')
    assert special not in literal
    assert literal and all(spelling.encode().startswith(domain.token_bytes[i]) for i in literal)
    by_id = _first_mask(domain, f'root ::= Token({special}) "x"')
    assert by_id == {special}


def test_empty_bytes_special_token_is_unreachable_by_id() -> None:
    """Why control tokens get non-UTF-8 bytes instead of empty ones: xgrammar 0.2.8 never allows
    Token(id) of a token it classifies as special (empty bytes). If this starts failing, xgrammar
    changed and token_domain.CONTROL_PREFIX may be revisited."""
    info = xgr.TokenizerInfo([b"a", b"b", b""], xgr.VocabType.RAW, vocab_size=4, stop_token_ids=[])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    matcher = xgr.GrammarMatcher(compiler.compile_grammar('root ::= "a" Token(2)'))
    assert matcher.accept_token(0)
    mask = xgr.allocate_token_bitmask(1, 4)
    matcher.fill_next_token_bitmask(mask)
    assert legal_ids(mask[0], 4) == []
