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
    assert cleared > 0 or name in ("any-strings", "nested-tags")
