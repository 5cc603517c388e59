"""The constraint-engine interface (services/grammar/engines/engine.py), the same contract on both
engines.

Design document, section 5/7: "Rollback uses the matcher's own rollback, never a replay"; a refused
draft leaves the committed state; "bits of the last word beyond V are zero"; EOS is legal exactly
where the language may end; control and never-generable ids are never content. DESIGN.md: one
matcher interface (accept, rollback, fill mask, may end, terminated) so that nothing outside the
grammar service knows which engine runs. The oracle for legality is enumeration: a token is legal
iff its bytes extend the output to a prefix of some word of the (finite) choice language, which
the test lists itself.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.grammar.compiler import ModelCompiler, choose_engine
from services.grammar.engines.batch import MaskFiller, fill_masks
from services.grammar.engines.matching import legal_ids
from shared.contract import OutputConstraint
from shared.errors import InternalError
from tests.support.common import byte_domain

ENGINES = ("xgrammar", "llguidance")
# A finite JSON language: the schema's enum, as the only layouts the profile allows.
WORDS = ['"ab"', '"abc"', "12", '{"k":[true,null]}', "[]"]
SCHEMA = {"enum": ["ab", "abc", 12, {"k": [True, None]}, []]}


@pytest.fixture(scope="module")
def compiled():
    comp = ModelCompiler(byte_domain())
    c = OutputConstraint.json_schema(SCHEMA, whitespace="compact")
    return {e: comp.compile(c, engine=e).grammar for e in ENGINES}


def oracle(prefix: bytes) -> set[int]:
    """Legal next ids after `prefix`: tokens whose bytes keep it a prefix of a word, plus EOS
    when it is a whole word."""
    d = byte_domain()
    words = [w.encode() for w in WORDS]
    out = {i for i, b in enumerate(d.token_bytes) if d.is_ordinary(i) and b
           and any(w.startswith(prefix + b) for w in words)}
    if prefix in words:
        out |= set(d.eos_ids)
    return out


def mask_of(matcher) -> set[int]:
    d = byte_domain()
    out = np.zeros((1, d.mask_words), dtype=np.int32)
    matcher.fill_mask(out)
    assert legal_ids(out[0], 32 * d.mask_words) == legal_ids(out[0], d.size)  # bits past V zero
    return set(legal_ids(out[0], d.size))


@pytest.mark.parametrize("engine", ENGINES)
def test_masks_match_the_enumerated_language(compiled, engine):
    d = byte_domain()
    for word in WORDS:
        m = compiled[engine].matcher()
        data = word.encode()
        for i, byte in enumerate(data):
            assert mask_of(m) == oracle(data[:i]), (word, i)
            assert m.is_completed() == (data[:i] in [w.encode() for w in WORDS])
            assert m.accept_token(byte)
        assert mask_of(m) == oracle(data) and m.is_completed() and not m.is_terminated()
        assert m.accept_token(min(d.eos_ids))
        assert m.is_terminated() and m.is_completed()


@pytest.mark.parametrize("engine", ENGINES)
def test_refused_tokens_leave_the_state(compiled, engine):
    d = byte_domain()
    ctl = next(iter(d.control_ids))
    m = compiled[engine].matcher()
    assert m.accept_token(ord('"'))
    before = mask_of(m)
    for bad in (ord("x"), ctl, min(d.eos_ids), d.size - 1, d.size, -1):
        assert not m.accept_token(bad)
        assert mask_of(m) == before
    assert not m.accept_bytes(b"zz") and mask_of(m) == before
    assert m.accept_bytes(b"ab") and mask_of(m) == oracle(b'"ab')


@pytest.mark.parametrize("engine", ENGINES)
def test_rollback_returns_to_the_same_state(compiled, engine):
    d = byte_domain()
    m = compiled[engine].matcher()
    seen = [mask_of(m)]
    for byte in b'"ab"':
        assert m.accept_token(byte)
        seen.append(mask_of(m))
    assert m.accept_token(min(d.eos_ids)) and m.is_terminated()
    m.rollback(1)  # EOS undone
    assert not m.is_terminated() and mask_of(m) == seen[4]
    m.rollback(3)
    assert mask_of(m) == seen[1] and not m.is_completed()
    with pytest.raises(InternalError):
        m.rollback(2)
    assert m.accept_token(ord("a")) and mask_of(m) == seen[2]


@pytest.mark.parametrize("engine", ENGINES)
def test_eos_after_a_word_nothing_can_extend(compiled, engine):
    """'12' and '[]' end the language (no byte can follow): EOS is still legal and undoable."""
    d = byte_domain()
    m = compiled[engine].matcher()
    assert m.accept_bytes(b"[") and m.accept_token(ord("]"))
    assert mask_of(m) == set(d.eos_ids)
    assert m.accept_token(min(d.eos_ids)) and m.is_terminated()
    assert not m.accept_token(ord(" "))
    m.rollback(1)
    assert not m.is_terminated() and m.is_completed() and mask_of(m) == set(d.eos_ids)


def test_batched_fill_equals_single_fills(compiled):
    """fill_masks over matchers of both engines writes exactly what each fill_mask writes."""
    d = byte_domain()
    matchers = []
    for i, word in enumerate(WORDS * 2):
        m = compiled[ENGINES[i % 2]].matcher()
        assert m.accept_bytes(word.encode()[: i % len(word)])
        matchers.append(m)
    rows = [2 * i + 1 for i in range(len(matchers))]
    out = torch.zeros((2 * len(matchers) + 1, d.mask_words), dtype=torch.int32)
    fill_masks(matchers, out, rows, MaskFiller(2))
    for m, r in zip(matchers, rows):
        single = np.zeros((1, d.mask_words), dtype=np.int32)
        m.fill_mask(single)
        assert np.array_equal(out[r].numpy(), single[0])
    assert not out[0].any()  # rows not asked for stay untouched
    with pytest.raises(InternalError):
        fill_masks(matchers[:2], out, [1, 1], MaskFiller(1))


@pytest.mark.parametrize("engine", ENGINES)
def test_buffers_are_checked(compiled, engine):
    d = byte_domain()
    m = compiled[engine].matcher()
    for bad in (np.zeros((1, d.mask_words), dtype=np.int64), np.zeros((1, d.mask_words + 1),
                                                                     dtype=np.int32),
                np.zeros((d.mask_words, 2), dtype=np.int32).T):
        with pytest.raises(InternalError):
            m.fill_mask(bad)
    with pytest.raises(InternalError):
        m.fill_mask(np.zeros((1, d.mask_words), dtype=np.int32), 1)


@pytest.mark.parametrize("engine", ENGINES)
def test_serialized_constraints_load_to_the_same_language(compiled, engine):
    comp = ModelCompiler(byte_domain())
    again = comp.deserialize(compiled[engine].serialize_json())
    assert again.engine == engine and again.memory_size_bytes > 0
    for word in WORDS:
        a, b = compiled[engine].matcher(), again.matcher()
        for i in range(len(word)):
            assert mask_of(a) == mask_of(b)
            assert a.accept_token(word.encode()[i]) and b.accept_token(word.encode()[i])
    with pytest.raises(InternalError):
        comp.deserialize("nonsense\n{}")


def test_the_engine_rule():
    """docs/constraint-engines.md: JSON content and Hermes tool grammars on llguidance, everything
    else on xgrammar (and everything on xgrammar while the worker still builds xgrammar matchers
    itself)."""
    from services.grammar.tools.hermes import ToolSpec
    from shared.contract import ToolChoice

    content = [OutputConstraint.json_object(), OutputConstraint.json_schema({"type": "string"})]
    json_kinds = content + [ToolSpec((), ToolChoice(), content[0])]
    others = [OutputConstraint.grammar('root ::= "a"'), OutputConstraint.regex("a+"),
              OutputConstraint.choice(["a"])]
    for c in json_kinds:
        assert choose_engine(c, interface=True) == "llguidance"
        assert choose_engine(c, interface=False) == "xgrammar"
    for c in others:
        assert choose_engine(c, interface=True) == "xgrammar"


def reference_lookahead(matcher, drafts, out) -> int:
    """The design document's loop (section 7), spelled out with single fills and accepts."""
    d = byte_domain()
    out[:] = 0
    n = 0
    for i in range(len(drafts) + 1):
        matcher.fill_mask(out, i)
        if i == len(drafts):
            break
        t = drafts[i]
        if not (0 <= t < d.size) or not (int(out[i, t >> 5]) >> (t & 31)) & 1:
            break
        assert matcher.accept_token(t)
        n += 1
        if t in d.eos_ids:
            out[i + 1] = 0
            break
    matcher.rollback(n)
    return n


@pytest.mark.parametrize("engine", ENGINES)
def test_lookahead_chain_equals_the_reference_loop(engine):
    """fill_lookahead: the K+1 masks of one call equal the fill/accept/rollback loop's, for
    legal chains, chains with an illegal or out-of-range draft, EOS drafts and dead ends, and
    the matcher is back where it was."""
    import random

    comp = ModelCompiler(byte_domain())
    g = comp.compile(OutputConstraint.json_schema(
        {"type": "object", "properties": {"a": {"enum": ["xy", 1]}, "b": {"type": "boolean"}},
         "required": ["a"]}, whitespace="compact"), engine=engine).grammar
    d = byte_domain()
    rng = random.Random(5)
    eos = min(d.eos_ids)
    for trial in range(40):
        m = g.matcher()
        text = rng.choice([b"", b"{", b'{"a":', b'{"a":"x', b'{"a":1', b'{"a":1}'])
        assert m.accept_bytes(text)
        # a legal chain from a second matcher, then perturbed
        walker, drafts = g.matcher(), []
        walker.accept_bytes(text)
        for _ in range(rng.randint(0, 6)):
            legal = sorted(mask_of(walker))
            if not legal:
                break
            t = rng.choice(legal)
            drafts.append(t)
            walker.accept_token(t)
            if t == eos:
                break
        if drafts and rng.random() < 0.4:
            drafts[rng.randrange(len(drafts))] = rng.choice([ord("z"), d.size + 3, eos])
        k = len(drafts)
        got = np.full((k + 3, d.mask_words), -1, dtype=np.int32)
        want = np.zeros((k + 1, d.mask_words), dtype=np.int32)
        before = mask_of(m)
        n = m.fill_lookahead(drafts, got, row=1)
        assert n == reference_lookahead(m, drafts, want), (text, drafts)
        assert np.array_equal(got[1:k + 2], want), (text, drafts, n)
        assert got[0].tolist() == [-1] * d.mask_words and got[k + 2].tolist() == [-1] * d.mask_words
        assert mask_of(m) == before
