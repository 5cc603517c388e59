"""JSON content after the thinking framing on llguidance, against the xgrammar grammar of record.

DESIGN.md, "Constraint engines": "the choice is made per compiled grammar by a written rule,
proved equivalent by differential tests, and nothing outside the grammar service knows which
engine runs. Neither engine may make a language looser." The design document's thinking framing:
"any token except </think> (ExcludeToken), then the </think> token (Token) and exactly the
separator \\n\\n", "an early EOS inside that reasoning branch must be prevented". On a small
vocabulary with thinking control tokens, for several schemas (bounded strings among them), both
engines give identical masks at every position of random walks through reasoning, the close
token, the separator and the content, with rollbacks, and agree on completion and termination.
"""

from __future__ import annotations

import random
from functools import lru_cache

import numpy as np
import pytest

from services.grammar.compiler import Framed, ModelCompiler, build_llguidance_lark, framed_engine
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR
from services.grammar.engines.matching import legal_ids
from shared.contract import OutputConstraint
from shared.frontends.token_domain import TokenDomain

FRAMING = "qwen-think-v1+raw"
_MERGES = (b'{"', b'":', b'",', b'"}', b"ab", b"\n\n", b"\n\n{", b"\n", b"ok", b"\xc3\xa9",
           b'\\"', b"  ", b"10", b"</think>")  # the last one: the close spelled as ordinary bytes
SCHEMAS = [
    {"type": "object", "properties": {"t": {"type": "string", "maxLength": 6}},
     "required": ["t"], "additionalProperties": False},
    {"type": "object", "properties": {"t": {"type": "string", "minLength": 2, "maxLength": 4},
                                      "n": {"type": "integer", "minimum": 0, "maximum": 99}}},
    {"type": "array", "items": {"enum": ["ab", "é", 1]}, "maxItems": 3},
    {"type": "string", "maxLength": 70},
]


@lru_cache(maxsize=1)
def think_domain() -> TokenDomain:
    """Every byte, a few merges, EOS, the thinking controls, one never-generable id, padding."""
    tokens = [bytes([b]) for b in range(256)] + list(_MERGES)
    names = {b"<eos>": "eos", b"<think>": "control", b"</think>": "control", b"<tool>": "control",
             b"<img>": "never"}
    ids: dict[str, set[int]] = {"eos": set(), "control": set(), "never": set()}
    special = []
    for spelling, kind in names.items():
        ids[kind].add(len(tokens))
        special.append((spelling.decode(), len(tokens)))
        tokens.append(spelling)
    return TokenDomain(name="think-test", token_bytes=tuple(tokens), size=len(tokens) + 7,
                       eos_ids=frozenset(ids["eos"]), control_ids=frozenset(ids["control"]),
                       never_ids=frozenset(ids["never"]), special_names=tuple(special))


def _pair(schema: dict):
    compiler = ModelCompiler(think_domain())
    source = Framed(OutputConstraint.json_schema(schema), FRAMING)
    return (compiler.compile(source, engine=XGRAMMAR).grammar,
            compiler.compile(source, engine=LLGUIDANCE).grammar)


def test_the_rule_puts_thinking_json_content_on_llguidance_and_tools_on_xgrammar():
    """The written rule (docs/constraint-engines.md): thinking + JSON content -> llguidance;
    other framings and kinds stay on xgrammar."""
    schema = OutputConstraint.json_schema({"type": "string"})
    assert framed_engine(schema, FRAMING) == LLGUIDANCE
    assert framed_engine(OutputConstraint.regex("a+"), FRAMING) == XGRAMMAR
    assert framed_engine(schema, "qwen-think-v1+qwen-xml-v1") == XGRAMMAR
    source = Framed(schema, FRAMING)
    assert ModelCompiler(think_domain()).compile(source).grammar.engine == LLGUIDANCE


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_thinking_json_masks_are_identical_on_both_engines(index):
    """Identical masks along random walks (reasoning of 0-6 tokens, the close, the separator,
    content), a rollback of 1-3 tokens now and then; same completion and termination."""
    xg, ll = _pair(SCHEMAS[index])
    domain = think_domain()
    close = domain.special_id("</think>")
    rng = random.Random(index)
    buf = np.zeros((2, domain.mask_words), dtype=np.int32)
    for walk in range(12):
        a, b = xg.matcher(), ll.matcher()
        reasoning = rng.randint(0, 6)
        pos = 0  # tokens accepted (rollbacks included)
        for step in range(80):
            a.fill_mask(buf, 0)
            b.fill_mask(buf, 1)
            ids = legal_ids(buf[0], domain.size)
            assert ids == legal_ids(buf[1], domain.size), (walk, step)
            assert a.is_completed() == b.is_completed() and a.is_terminated() == b.is_terminated()
            if not ids:
                break
            if pos < reasoning:
                assert close in ids and not set(ids) & domain.eos_ids  # no early EOS
                assert all(i == close or domain.is_ordinary(i) for i in ids)
            token = close if pos == reasoning and close in ids else rng.choice(ids)
            assert a.accept_token(token) == b.accept_token(token) is True
            pos += 1
            if token in domain.eos_ids:
                break
            k = rng.randint(1, 3)
            if pos - k > reasoning + 1 and rng.random() < 0.15:
                a.rollback(k)
                b.rollback(k)
                pos -= k


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_the_thinking_framing_leaves_the_content_rules_as_they_are(index):
    """framing.py: the Lark of the thinking framing is "the language of `thinking_prefix_ebnf`
    followed by the content": its own two rules (the entry and the reasoning) beside the content's
    rules and lexemes, every one of them as the bare content writes it (so a mask inside the
    content, a bounded string's included, costs what it costs without the framing)."""
    domain = think_domain()
    constraint = OutputConstraint.json_schema(SCHEMAS[index])
    bare = build_llguidance_lark(constraint, None, domain).splitlines()
    framed = build_llguidance_lark(constraint, FRAMING, domain).splitlines()
    [entry] = [line for line in bare if line.startswith("start: ")]
    [framed_entry] = [line for line in framed if line.startswith("start: ")]
    assert framed_entry.endswith(" " + entry.removeprefix("start: ")), framed_entry
    assert sorted(set(framed) - set(bare)) == sorted([framed_entry, next(
        line for line in framed if line.startswith("thinking_reasoning: "))])
    assert set(bare) - set(framed) == {entry}
