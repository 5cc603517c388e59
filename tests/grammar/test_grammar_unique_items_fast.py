"""The unique-items companion's kept answers and shortcuts (probe answers by output digest, each
state's decisions, the whitespace tokens of an open number decided as one, the closers of an open
string looked up by content, sparse candidate scans) leave every mask as the reference path
(`fast=False`: every legal token decided afresh, every probe searched again) writes it, bit for
bit, on random walks with rollbacks, over a byte vocabulary and SmolLM2's."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bench.unique_items import CASES
from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids
from services.grammar.unique_items import unique_items_for
from shared.contract import OutputConstraint
from shared.frontends import get_domain
from tests.grammar.test_grammar_unique_items import EXACT_SCHEMAS
from tests.support.common import byte_domain

SCHEMAS = [c[1] for c in CASES] + EXACT_SCHEMAS + [
    {"type": "array", "uniqueItems": True, "items": {"type": ["string", "integer", "null"]}},
    # bounded strings counted, an open escape included; values with escapes and raw UTF-8
    {"type": "array", "uniqueItems": True, "items": {"type": "string", "minLength": 1,
                                                     "maxLength": 2}},
    {"type": "array", "uniqueItems": True, "items": {"enum": ['"', "\\", "a\"", "é", "\u00e9x",
                                                              "\n", None, True, "b", 3]}},
    {"type": "array", "uniqueItems": True, "items": {"type": "integer", "minimum": -25,
                                                     "maximum": 40, "multipleOf": 5}},
]


def _walks(domain, schema, walks: int, steps: int, seed: int) -> tuple[int, int]:
    constraint = OutputConstraint.json_schema(schema, whitespace="any")
    grammar = ModelCompiler(domain).compile(constraint).grammar
    rng = random.Random(seed)
    masks = cleared = 0
    for _ in range(walks):
        fast = unique_items_for(constraint, domain)
        slow = unique_items_for(constraint, domain, fast=False)
        matcher = grammar.matcher()
        taken = 0
        for _ in range(steps):
            mask = np.zeros((1, domain.mask_words), dtype=np.int32)
            matcher.fill_mask(mask, 0)
            want, got = mask.copy(), mask.copy()
            slow.apply(want[0], matcher)
            for _ in range(2):  # the second at the same state reads the kept decisions
                again = mask.copy()
                fast.apply(again[0], matcher)
                assert np.array_equal(again, want), (schema, taken)
            got = again
            masks += 1
            cleared += int(np.count_nonzero(got != mask))
            ids = [t for t in legal_ids(got[0], domain.size) if t not in domain.eos_ids]
            if not ids:
                break
            if taken and rng.random() < 0.2:  # a rejected draft: both follow the rollback
                matcher.rollback(1)
                fast.rollback(1)
                slow.rollback(1)
                taken -= 1
                continue
            t = rng.choice(ids)
            assert matcher.accept_token(t)
            fast.accept(t)
            slow.accept(t)
            taken += 1
    return masks, cleared


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_fast_masks_equal_reference_on_bytes(schema):
    """'Every token the mask allows has a legal completion' is the reference's to keep exact (the
    brute-force tests): the fast path must write the same bits."""
    masks, _ = _walks(byte_domain(), schema, walks=6, steps=24, seed=3)
    assert masks > 20


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fast_masks_equal_reference_on_smollm2(case):
    """The same on a real vocabulary, where tokens span items, closers and whitespace runs."""
    masks, cleared = _walks(get_domain("smollm2"), case[1], walks=3, steps=14, seed=5)
    assert masks > 10


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fast_masks_equal_reference_along_bench_outputs(case):
    """Along the bench's valid outputs (SmolLM2's own tokens), where used items are repeated
    prefixes of what comes next, so tokens are cleared and probes run."""
    from bench.json_names import layout_values, tokenize

    name, schema, outputs = case
    domain = get_domain("smollm2")
    probes = 0
    constraint = OutputConstraint.json_schema(schema, whitespace="any")
    grammar = ModelCompiler(domain).compile(constraint).grammar
    cleared = 0
    for text in layout_values(schema, outputs):
        fast = unique_items_for(constraint, domain)
        slow = unique_items_for(constraint, domain, fast=False)
        matcher = grammar.matcher()
        for t in tokenize("smollm2", text):
            mask = np.zeros((1, domain.mask_words), dtype=np.int32)
            matcher.fill_mask(mask, 0)
            want, got = mask.copy(), mask.copy()
            cleared += slow.apply(want[0], matcher)
            fast.apply(got[0], matcher)
            assert np.array_equal(got, want), (name, text)
            assert matcher.accept_token(t)
            fast.accept(t)
            slow.accept(t)
        probes += fast.probes
    assert cleared > 0 or name in ("any-strings", "nested-tags")
    if name in ("enum-12", "short-strings"):
        assert probes == 0  # the domain's values or a count decide, no walk through the matcher


ALONG = [
    # at maxLength the content of a used item can only close (False); an open `\` and `\u`
    # sharing content with used items are counted
    (SCHEMAS[-3], ['["ab","a', '["ab","\\n","\\', '["\\n","\\u', '["\\"","\\']),
    # a finite domain: the values its content begins, escapes spelled as the grammar does
    (SCHEMAS[-2], ['["\\"","a\\"","\\\\","éx","\\n","b","', '["a\\"","a', '[3,null,true,"']),
    # integers counted by their canonical spellings in the range: a used prefix, a sign, a zero
    (EXACT_SCHEMAS[2], ['[1,10,11,1', '[0,1,', '[2,1,12,1']),
    (SCHEMAS[-1], ['[-5,-2', '[40,4', '[-20,-25,-', '[0,-15,-1']),
]


@pytest.mark.parametrize("schema,texts", ALONG, ids=range(len(ALONG)))
def test_fast_masks_equal_reference_along_chosen_texts(schema, texts):
    """Byte by byte along texts that reach the counted and the finite-domain answers (a random
    walk seldom does), each mask as the reference writes it; the fast path probes less (an open
    escape at the last place or in a finite domain, a number whose every value is used, still
    probe)."""
    domain = byte_domain()
    constraint = OutputConstraint.json_schema(schema, whitespace="any")
    grammar = ModelCompiler(domain).compile(constraint).grammar
    cleared = probes = reference = 0
    for text in texts:
        fast = unique_items_for(constraint, domain)
        slow = unique_items_for(constraint, domain, fast=False)
        matcher = grammar.matcher()
        for t in text.encode():
            mask = np.zeros((1, domain.mask_words), dtype=np.int32)
            matcher.fill_mask(mask, 0)
            want, got = mask.copy(), mask.copy()
            cleared += slow.apply(want[0], matcher)
            fast.apply(got[0], matcher)
            assert np.array_equal(got, want), text
            assert matcher.accept_token(t), text  # byte_domain: token id b is byte b
            fast.accept(t)
            slow.accept(t)
        mask = np.zeros((1, domain.mask_words), dtype=np.int32)
        matcher.fill_mask(mask, 0)
        want, got = mask.copy(), mask.copy()
        cleared += slow.apply(want[0], matcher)
        fast.apply(got[0], matcher)
        assert np.array_equal(got, want), text
        probes += fast.probes
        reference += slow.probes
    assert cleared > 0
    assert probes < reference, (probes, reference)
