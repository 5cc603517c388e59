"""Copying modulo JSON layout (services/worker/spec/layout.py, the n-gram proposer's first try).

Issue rule: "the n-gram proposer matches the prompt modulo JSON layout (whitespace between tokens,
and the generation layout's indentation), so copying a compact JSON prompt into an indented answer
keeps drafting"; target: "n-gram acceptance within 10 points of the unconstrained run".

Independent base: `json.dumps` writes the compact prompt and the answer in both layouts; the
SmolLM2 tokenizer's split of the answer is what greedy decoding of that text emits. Acceptance
is simulated as a verify round does it: drafts count until the first one that differs from the
answer's next token, then the answer's token is committed.
"""

from __future__ import annotations

import json

import pytest

from services.worker.spec.layout import layout_copy, normalize, to_original
from services.worker.spec.ngram import NgramProposer
from shared.frontends import get_frontend

OBJ = {"id": "A-10293", "customer": "Maria Lopez", "email": "maria.lopez@example.com",
       "city": "Valencia", "items": ["notebook", "blue pen", "stapler"],
       "note": "fragile: yes, {handle} [with] care", "status": "pending"}


@pytest.fixture(scope="module")
def frontend():
    return get_frontend("smollm2")


def simulate(proposer, prompt, answer, k=4) -> tuple[int, int]:
    """(accepted, proposed) drafts over greedy rounds that commit `answer`."""
    accepted = proposed = i = 0
    while i < len(answer):
        drafts = proposer.propose(prompt + answer[:i], k)
        n = 0
        while n < len(drafts) and i + n < len(answer) and drafts[n] == answer[i + n]:
            n += 1
        accepted, proposed, i = accepted + n, proposed + len(drafts), i + n + 1
    return accepted, proposed


def test_normalize_removes_whitespace_next_to_punctuation_only():
    data = b'{"a": [1, 2],\n  "b c": "x y"}'
    norm, spans = normalize(data)
    assert norm == b'{"a":[1,2],"b c":"x y"}'
    for pos in range(len(norm)):  # every kept byte maps back onto itself
        assert data[to_original(pos, spans)] == norm[pos] or \
            data[to_original(pos, spans)] in b" \n"


@pytest.mark.parametrize("indent", [2, 4])
def test_a_compact_prompt_copies_into_an_indented_answer(frontend, indent):
    encode, tb = frontend.tokenizer.encode, frontend.domain.token_bytes
    prompt = encode("Rewrite this JSON object exactly:\n" + json.dumps(OBJ) + "\n")
    layout = NgramProposer(token_bytes=tb, encode=encode)
    exact = NgramProposer()
    compact = encode(json.dumps(OBJ))
    indented = encode(json.dumps(OBJ, indent=indent))
    base_acc, base_prop = simulate(layout, prompt, compact)
    exact_acc, exact_prop = simulate(exact, prompt, compact)
    assert base_acc >= exact_acc  # the compact copy is no worse than the exact n-gram's
    acc, prop = simulate(layout, prompt, indented)
    old_acc, old_prop = simulate(exact, prompt, indented)
    unconstrained = base_acc / base_prop
    assert acc / prop >= unconstrained - 0.10, (acc, prop, base_acc, base_prop)
    assert acc / prop > old_acc / old_prop + 0.25  # what the exact n-gram loses to the layout
    assert acc > old_acc


def test_strings_are_copied_verbatim_inside_an_indented_copy(frontend):
    """Commas, colons and brackets inside a string value are text, not layout."""
    encode, domain = frontend.tokenizer.encode, frontend.domain
    text = json.dumps(OBJ, indent=2)
    cut = text.index('"fragile') + 1
    data = ("Rewrite: " + json.dumps(OBJ) + "\n" + text[:cut]).encode()
    drafts = layout_copy(data, encode, 32, limit=200)
    copied = b"".join(domain.token_bytes[t] for t in drafts)
    # the copy goes on past the object with what followed it in the context
    assert copied.startswith(text.encode()[cut:])


def test_no_copy_without_a_match(frontend):
    assert layout_copy(b"abcdefghijklmnopqrstuvwxyz", frontend.tokenizer.encode, 4) == []
    assert layout_copy(b"", frontend.tokenizer.encode, 4) == []
