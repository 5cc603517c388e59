"""Grammar drafts (services/worker/spec/grammar.py) over a real tokenizer and real schemas.

The rules checked (issue text of the grammar drafter, DESIGN.md "Speculation": "The grammar
proposer drafts the text the grammar forces, canonically tokenized, stopping one token before
free text"):

- drafts are exactly the forced text's canonical tokens (the target tokenizer's own split of the
  bytes the grammar forces), without the last one where free text follows;
- a boundary token is never drafted: the bytes of the drafts are a proper prefix of the forced
  text wherever free text follows it, and the missing tail is that last canonical token;
- where the forced text ends the output every token is drafted;
- proposing leaves the committed matcher exactly where it was (masks and forced bytes).

Independent bases: `json.dumps(instance, indent=2)` (the indented layout's text, so the forced runs
between values are known), the SmolLM2 tokenizer itself, and a fresh session fed the same tokens.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch

from services.grammar.compiler import ModelCompiler
from services.worker.output.session import OutputSession
from services.worker.spec.grammar import (
    GrammarProposer,
    canonical_tokens,
    complete_utf8,
    compose,
    forced_drafts,
)
from shared.contract import OutputConstraint
from shared.frontends import get_frontend

SCHEMA = {"type": "object", "properties": {
    "id": {"type": "string"}, "customer": {"type": "string"},
    "status": {"enum": ["pending", "shipped", "delivered"]},
    "items": {"type": "array", "items": {"type": "string"}}},
    "required": ["id", "customer", "status", "items"], "additionalProperties": False}
INSTANCE = {"id": "A-10293", "customer": "Maria Lopez", "status": "shipped",
            "items": ["notebook", "blue pen"]}


@pytest.fixture(scope="module")
def frontend():
    return get_frontend("smollm2")


@pytest.fixture(scope="module", params=["xgrammar", "llguidance"])
def compiled(request, frontend):
    constraint = OutputConstraint.json_schema(SCHEMA, whitespace="indented")
    return ModelCompiler(frontend.domain).compile(constraint, engine=request.param).grammar


def session_after(frontend, compiled, tokens) -> OutputSession:
    s = OutputSession(frontend.domain, compiled)
    r = s.preview(tokens)
    assert r.failure is None and r.accepted == len(tokens)
    s.confirm()
    return s


def drafts_at(frontend, session, k=64) -> list[int]:
    with session.probe() as probe:
        return forced_drafts(probe, frontend.tokenizer.encode, k)


def test_complete_utf8_and_canonical_tokens(frontend):
    assert complete_utf8(b"ab\xc3") == (b"ab", b"\xc3")
    assert complete_utf8(b"ab\xc3\xa9") == (b"ab\xc3\xa9", b"")
    assert complete_utf8(b"\xe6\x97") == (b"", b"\xe6\x97")
    assert complete_utf8(b"x\xf0\x9f\x98") == (b"x", b"\xf0\x9f\x98")
    encode = frontend.tokenizer.encode
    assert canonical_tokens(encode, b'": "') == (encode('": "'), b"")
    assert canonical_tokens(encode, b'"d\xc3') == (encode('"d'), b"\xc3")
    assert canonical_tokens(encode, b"\xa9x") == ([], b"\xa9x")  # starts inside a character


def test_drafts_are_the_canonical_tokens_of_the_forced_text(frontend, compiled):
    """After `{`, after a closed string value, and inside an enum value the indented layout
    forces the text up to the next free choice (json.dumps(indent=2) tells what it is): the
    drafts are that text's SmolLM2 tokens, the last one left to the model."""
    encode, domain = frontend.tokenizer.encode, frontend.domain
    text = json.dumps(INSTANCE, indent=2)
    cases = [  # (committed text, forced text up to the next free byte)
        ("{", text[1:text.index('"A-10293"') + 1]),
        (text[:text.index('"A-10293"') + 9],
         text[text.index('"A-10293"') + 9:text.index('"Maria') + 1]),
        (text[:text.index('"shipped"') + 2], text[text.index('"shipped"') + 2:text.index("[") + 1]),
    ]
    for committed, forced in cases:
        session = session_after(frontend, compiled, encode(committed))
        with session.probe() as probe:
            assert probe.forced_bytes() == forced.encode()
        drafts = drafts_at(frontend, session)
        assert drafts == encode(forced)[:-1], (forced, drafts)
        assert drafts  # every case forces more than one token
        assert b"".join(domain.token_bytes[t] for t in drafts) != forced.encode()


def test_a_boundary_token_is_never_drafted(frontend, compiled):
    """Along the plain tokenization of the instance, at every position: the drafts are the
    forced text's canonical tokens without the last when free text follows, all of them when the
    output ends there; their bytes are then a proper prefix of the forced text."""
    encode, domain = frontend.tokenizer.encode, frontend.domain
    tokens = encode(json.dumps(INSTANCE, indent=2))
    fired = 0
    for i in range(len(tokens) + 1):
        session = session_after(frontend, compiled, tokens[:i])
        with session.probe() as probe:
            forced = probe.forced_bytes()
        drafts = drafts_at(frontend, session)
        if not forced:
            assert drafts == [], i
            continue
        fired += bool(drafts)
        canonical = encode(forced.decode())
        ends = i == len(tokens) or json.dumps(INSTANCE, indent=2).encode().endswith(forced)
        if ends:
            assert drafts == canonical, i
        else:
            assert drafts == canonical[:-1], i
            assert len(b"".join(domain.token_bytes[t] for t in drafts)) < len(forced)
    assert fired >= 6


def test_proposing_leaves_the_matcher_where_it_was(frontend, compiled):
    encode, domain = frontend.tokenizer.encode, frontend.domain
    text = json.dumps(INSTANCE, indent=2)
    tokens = encode(text[:text.index('"A-10293"') + 9])  # a forced run follows
    session = session_after(frontend, compiled, tokens)
    fresh = session_after(frontend, compiled, tokens)

    class Job:
        pass

    job = Job()
    job.session = session
    drafts = GrammarProposer(encode, 8).propose(job, 8)
    assert drafts
    a = torch.zeros((1, domain.mask_words), dtype=torch.int32)
    b = a.clone()
    session.lookahead((), a)
    fresh.lookahead((), b)
    assert torch.equal(a, b)
    with session.probe() as p, fresh.probe() as q:
        assert p.forced_bytes() == q.forced_bytes()


def test_compose_fills_between_forced_runs(frontend, compiled):
    """The other proposer drafts the free text; the grammar drafts the forced run after it; an
    illegal proposal of the other stays a proposal ("Drafts are never constrained; the target
    is.") and ends the round."""
    encode = frontend.tokenizer.encode
    text = json.dumps(INSTANCE, indent=2)
    cut = text.index('"A-10293"') + 1
    session = session_after(frontend, compiled, encode(text[:cut]))
    value = encode('A-10293"')  # the other proposer copies the value and its closing quote

    def other(drafts, n):
        return value[:n] if not drafts else []

    with session.probe() as probe:
        drafts = compose(probe, encode, 16, other)
    after = encode(text[cut + len('A-10293"'):text.index('"customer"') + len('"customer": "')])
    assert drafts[:len(value)] == value
    assert drafts[len(value):] == after[:-1]  # the forced run after the value, its last left
    with session.probe() as probe:
        # a raw newline is illegal inside the string
        bad = compose(probe, encode, 16, lambda d, n: encode("\nx")[:n] if not d else [])
    assert bad == encode("\nx")[:1]


# ---------------------------------------------------------------- through the engine

LONG = {"type": "object", "properties": {
    "customer_reference": {"type": "string", "maxLength": 5},
    "delivery_status": {"enum": ["pending", "shipped", "delivered_to_neighbour"]},
    "count": {"type": "integer"}},
    "required": ["customer_reference", "delivery_status", "count"], "additionalProperties": False}
ENGINE_CASES = [
    ("long", "json", OutputConstraint.json_schema(LONG)),
    ("indented", "json", OutputConstraint.json_schema(LONG, whitespace="indented")),
    ("small", "obj", OutputConstraint.json_schema(
        {"type": "object", "properties": {"a": {"type": "string", "maxLength": 6},
                                          "b": {"type": "integer"}},
         "required": ["a", "b"], "additionalProperties": False})),
    ("choice", "pick", OutputConstraint.choice(["abab: true null", "abab: null", "omega"])),
    ("free", "abcabcab", None),
]


def longest_match(domain):
    """A tokenizer that prefers the byte test vocabulary's merges (`{"`, `":`, `, `...): its
    split of forced text often differs from the one a model picks."""
    merges = sorted((t for t in domain.token_bytes if len(t) > 1 and domain.token_bytes.index(t)
                     not in domain.special_ids), key=len, reverse=True)

    def encode(text: str) -> list[int]:
        data, out, i = text.encode(), [], 0
        while i < len(data):
            m = next((t for t in merges if data.startswith(t, i)), data[i:i + 1])
            out.append(domain.token_bytes.index(m))
            i += len(m)
        return out
    return encode


async def _engine_outputs(runtime, speculative, k=4, max_tokens=40, encode=None):
    from services.worker.spec import GrammarProposer
    from tests.support.worker_support import collect, greedy, open_client, text_request

    config = {"speculative": speculative, "num_draft_tokens": k} if speculative else {}
    client = open_client(runtime, max_batch=4, max_len=192, **config)
    if encode is not None:
        client.engine.proposer = GrammarProposer(encode, k)
    tokens = {}
    client.engine.finish_listeners.append(
        lambda job: tokens.__setitem__(job.request_id, tuple(job.output_ids)))
    try:
        await asyncio.gather(*(collect(client, text_request(
            rid, prompt, greedy(max_tokens, constraint=c), runtime.name))
            for rid, prompt, c in ENGINE_CASES))
        return tokens, client.engine.speculation
    finally:
        await client.aclose()


@pytest.mark.parametrize("backend,split", [("grammar", "bytes"), ("grammar", "merges"),
                                           ("ngram", "bytes")])
def test_grammar_speculation_is_token_identical_with_rejections(backend, split):
    """`--speculative grammar` on a random model over the byte vocabulary, constrained rows and
    an unconstrained one in one batch: the output is token for token plain greedy decoding's.
    With a tokenizer that prefers merges the model often splits the forced text otherwise, so
    drafts are rejected, and the tokens after each rejection (decided by the next round's masks)
    are still plain decoding's: the rejection left the matcher where plain decoding would.
    `ngram`: grammar drafts composed with n-gram copy drafts in the same rounds."""
    from tests.support.worker_support import no_z_domain, tiny_runtime

    runtime = tiny_runtime(no_z_domain())
    plain, _ = asyncio.run(_engine_outputs(runtime, None))
    encode = longest_match(runtime.domain) if split == "merges" else None
    spec_tokens, spec = asyncio.run(_engine_outputs(runtime, backend, encode=encode))
    assert spec_tokens == plain
    assert spec.accepted > 0
    if split == "merges":
        assert spec.drafts > spec.accepted  # rejected drafts too


def test_a_rejected_grammar_draft_leaves_the_matcher_as_plain_decoding(frontend, compiled):
    """The session transaction of a verify round whose target rejects the first grammar draft:
    lookahead over the drafts, then the preview and confirm of the target's own token (a
    different legal split of the forced text). The committed matcher equals a fresh session's
    fed the same tokens: same mask, same forced bytes, same drafts next."""
    encode, domain = frontend.tokenizer.encode, frontend.domain
    committed = encode("{")
    session = session_after(frontend, compiled, committed)
    drafts = drafts_at(frontend, session, 4)
    assert len(drafts) >= 2
    forced = b"".join(domain.token_bytes[t] for t in drafts)
    # the target's choice: a shorter token that is a proper prefix of the first draft's bytes
    first = domain.token_bytes[drafts[0]]
    other = next(t for t in encode(first.decode()[:1]) if domain.token_bytes[t] != first)
    masks = torch.zeros((len(drafts) + 1, domain.mask_words), dtype=torch.int32)
    look = session.lookahead(drafts, masks)
    assert look.illegal_at is None
    assert (int(masks[0, other >> 5]) >> (other & 31)) & 1  # the correction is legal
    r = session.preview([other])
    assert r.failure is None
    session.confirm()
    fresh = session_after(frontend, compiled, committed + [other])
    a = torch.zeros((1, domain.mask_words), dtype=torch.int32)
    b = a.clone()
    session.lookahead((), a)
    fresh.lookahead((), b)
    assert torch.equal(a, b)
    assert drafts_at(frontend, session) == drafts_at(frontend, fresh)
    assert forced.startswith(domain.token_bytes[other])


def test_propose_after_continues_a_context_or_an_own_chain():
    """Composition asks the other proposer for drafts after the round's earlier ones: a context
    proposer (n-gram) sees them as context; a chain drafted from the committed output (MTP)
    continues only where they are its own first drafts."""
    from services.worker.spec import ContextProposer, HostProposer, NgramProposer

    class Job:
        prompt_ids = (5, 6, 7, 5)
        output_ids: list = []

    class Chain(HostProposer):
        def propose(self, job, n):
            return [1, 2, 3, 4][:n]

    chain = Chain(4)
    assert chain.propose_after(Job, (1, 2), 2) == [3, 4]
    assert chain.propose_after(Job, (9,), 2) == []
    ngram = ContextProposer(NgramProposer(min_n=2, max_n=2), 4)
    assert ngram.propose_after(Job, (6,), 3) == [7, 5, 6]  # [5, 6] matched at the start


def test_a_matcher_that_raises_in_a_probe_drafts_nothing_and_releases_the_session(
        frontend, compiled):
    """Drafts are optional: a constraint engine that raises while the grammar drafter walks gives
    no drafts, and the session takes its next lookahead (where a real failure is reported)."""
    encode, domain = frontend.tokenizer.encode, frontend.domain
    session = session_after(frontend, compiled, encode("{"))

    class Job:
        request_id = "r"

    job = Job()
    job.session = session
    matcher = session._matcher
    real = matcher.forced_bytes
    matcher.forced_bytes = lambda: (_ for _ in ()).throw(RuntimeError("engine failure"))
    try:
        assert GrammarProposer(encode, 4).propose(job, 4) == []
    finally:
        matcher.forced_bytes = real
    masks = torch.zeros((1, domain.mask_words), dtype=torch.int32)
    session.lookahead((), masks)  # not "while a probe is open"
    assert GrammarProposer(encode, 4).propose(job, 4)  # and drafts again
