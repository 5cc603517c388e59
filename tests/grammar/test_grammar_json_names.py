"""JsonNameConstraint and the JSON text reader: no generated object repeats a member name, and
the mask stays exact (every token it allows has a complete output with unique names).

Issue cases run through `infernix grammar check`; exactness is checked against a brute-force
oracle over a small byte vocabulary (an independent search through the grammar whose finished
texts Python's json parser checks for repeated names)."""

from __future__ import annotations

import io
import json
import random

import jsonschema
import numpy as np
import pytest

from services.grammar.cli import run_check
from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids, random_walk
from services.grammar.json_names import JsonNameConstraint, JsonNameIndex, json_names_for
from services.grammar.json_text import START, Duplicate, feed, repeats_a_name
from shared.contract import OutputConstraint
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain


def _has_repeat(text: bytes) -> bool:
    """The oracle: Python's json parser, told to report a name seen twice in one object."""
    found = []

    def pairs(items):
        names = [k for k, _ in items]
        found.append(len(names) != len(set(names)))
        return dict(items)

    json.loads(text.decode("utf-8", "surrogatepass"), object_pairs_hook=pairs)
    return any(found)


# Spellings of names that unescape alike (the same Python string) or differently.
SPELLINGS = ['"a"', '"\\u0061"', '"\\u0041"', '"A"', '"\\ud83d\\ude00"', '"\U0001F600"',
             '"\\ud83d"', '"\\ud83d\\u0041"', '"\\ud83dA"', '"\\""', '"\\u0022"', '"\\\\"',
             '"\\/"', '"/"', '"\\n"', '"\\u000a"', '""', '"é"', '"\\u00e9"', '"ab"', '"a\\u0062"']


def _random_json(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice(["1", "-2.5e3", "true", "null", '"x"', '"\\"}"', '"a,\\"b\\":"'])
    if r < 0.45:
        return "[" + ",".join(_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))) + "]"
    ws = rng.choice(["", " ", "\n  "])
    members = [f"{ws}{rng.choice(SPELLINGS)}{ws}:{ws}{_random_json(rng, depth + 1)}"
               for _ in range(rng.randint(0, 3))]
    return "{" + ",".join(members) + ws + "}"


def test_reader_finds_repeats_as_python_json_reads_names():
    """'Names must be compared after JSON unescaping (`"\\u0061"` == `"a"`)': on random nested
    texts mixing escaped, surrogate-pair, lone-surrogate and raw spellings, the reader reports a
    repeated name exactly when Python's json parser sees one in the same object."""
    rng = random.Random(5)
    repeats = 0
    for _ in range(3000):
        text = _random_json(rng).encode("utf-8")
        expected = _has_repeat(text)
        repeats += expected
        assert repeats_a_name(text) is expected, text
    assert 200 < repeats < 2800  # both outcomes are well covered


def test_reader_keeps_one_name_set_per_object():
    """Per-depth name sets: the same name in sibling or nested objects is no repeat."""
    assert not repeats_a_name(b'{"a":{"a":1},"b":[{"a":1},{"a":2}]}')
    assert repeats_a_name(b'{"a":{"a":1},"b":[{"a":1,"a":2}]}')
    assert repeats_a_name(b'[{"x":{}, "y":1, "x":2}]')
    with pytest.raises(Duplicate):
        feed(START, b'{"\\u0061":1,"a"')


ISSUE_CASES = [
    ({"minProperties": 2}, ['{"a":1,"a":2}', '{"a":1,"b":2}', '{"a":1,"\\u0061":2}', '{"a":1}']),
    ({"type": "object", "not": {"maxProperties": 1}}, ['{"a":1,"a":2}', '{"a":1,"b":2}']),
    ({"type": "object", "if": {"maxProperties": 1}, "then": False},
     ['{"a":1,"a":2}', '{"a":1,"b":2}', '{}']),
    ({"type": "array", "items": {"type": "object", "minProperties": 2}},
     ['[{"a":1,"a":2}]', '[{"a":1,"b":2}]', '[{"a":1,"b":2},{"a":1,"b":{"c":1,"c":2}}]']),
    ({"type": "object", "dependentRequired": {"a": ["b"]}, "minProperties": 2},
     ['{"b":1,"b":1}', '{"b":1,"c":1}', '{"a":1,"b":1}', '{"a":1,"c":1}']),
    ({"allOf": [{"type": "object"}, {"minProperties": 3, "required": ["a"]}]},
     ['{"a":1,"b":1,"b":2}', '{"a":1,"b":1,"c":2}', '{"a":1,"a":1,"b":2}']),
]


def _expected(schema, text: str) -> bool:
    # valid output: unique names (the rule) and valid for the parsed value
    data = text.encode()
    return not _has_repeat(data) and jsonschema.Draft202012Validator(schema).is_valid(
        json.loads(text))


def test_issue_cases_through_grammar_check(tmp_path):
    """The issue's duplicate-key cases compile and `grammar check` accepts exactly the valid
    instances: `{"minProperties": 2}` rejects `{"a":1,"a":2}` (and `"\\u0061"` after `"a"`), and
    so do the negated and conditional counts, the nested array item and dependentRequired."""
    batch = tmp_path / "batch.jsonl"
    lines = [{"json_schema": s, "instances": texts} for s, texts in ISSUE_CASES]
    lines.append({"json_object": True, "instances": ['{"a":{"x":1,"x":2}}', '{"a":{"x":1}}']})
    batch.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    args = type("A", (), {"batch": str(batch), "model": "smollm2", "json_whitespace": "any"})()
    out = io.StringIO()
    assert run_check(args, out) == 0, out.getvalue()
    answers = [json.loads(x) for x in out.getvalue().splitlines()]
    for (schema, texts), answer in zip(ISSUE_CASES, answers):
        assert answer["accepted"] == [_expected(schema, t) for t in texts], (schema, answer)
    assert answers[-1]["accepted"] == [False, True]


def test_finite_name_sets_keep_the_count_refusal():
    """A count that undeclared names restricted to a finite set would have to fill stays refused
    at its pointer (a dead end deeper than the next name); without a companion (`unique_names`
    off) so does any count of undeclared names. Tool arguments run with the companion:
    tests/grammar/test_grammar_tool_json_names.py."""
    from services.grammar.schema import schema_to_ebnf
    from shared.errors import SchemaSource

    with pytest.raises(UnsupportedSchema) as err:
        schema_to_ebnf({"type": "object", "minProperties": 2},
                       source=SchemaSource.TOOL_ARGUMENTS, tool_index=0, tool_name="t")
    assert err.value.pointer == "/minProperties"
    with pytest.raises(UnsupportedSchema) as err:  # content too, where names are a finite set
        schema_to_ebnf({"type": "object", "propertyNames": {"enum": ["a", "b"]},
                        "minProperties": 3}, unique_names=True)
    assert err.value.pointer == "/minProperties"


def test_no_companion_where_no_name_is_free():
    """'Cost nothing for rows whose grammar has no free names': closed objects, scalars and
    non-JSON constraints get no companion; json_object and open objects do."""
    d = byte_domain()
    closed = {"type": "object", "properties": {"a": {"type": "integer"}},
              "additionalProperties": False}
    assert json_names_for(OutputConstraint.json_schema(closed), d) is None
    assert json_names_for(OutputConstraint.json_schema({"type": "string"}), d) is None
    assert json_names_for(OutputConstraint.regex("a+"), d) is None
    assert json_names_for(OutputConstraint.json_object(), d) is not None
    nested = {"type": "array", "items": {"type": "object"}}
    assert json_names_for(OutputConstraint.json_schema(nested), d) is not None


# ---------------------------------------------------------------- mask exactness

# Enough to finish every output of the schemas below (continuation bytes finish a UTF-8 lead).
ORACLE_BYTES = b'{}[]:,"1abc\x80\x90\xa0'
WALK_BYTES = b'{}[]:,"1abc'  # what the walks choose from


def _completes(matcher, text: bytearray, depth: int) -> bool:
    """Brute force: some completion over ORACLE_BYTES (at most `depth` bytes) that the grammar
    accepts as a whole output and whose names are unique per object."""
    if matcher.is_completed():
        try:
            if not _has_repeat(bytes(text)):
                return True
        except ValueError:
            pass
    if depth == 0:
        return False
    for b in ORACLE_BYTES:
        if matcher.accept_token(b):  # byte_domain: token id b is byte b
            text.append(b)
            try:
                if _completes(matcher, text, depth - 1):
                    return True
            finally:
                text.pop()
                matcher.rollback(1)
    return False


EXACT_SCHEMAS = [
    {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "additionalProperties": {"const": 1}},
    {"type": "object", "patternProperties": {"^a$": {"const": 1}}, "additionalProperties": False},
    {"type": "object", "properties": {"a": {"const": 1}}, "patternProperties": {"^(a|b)$":
                                                                                 {"const": 1}},
     "additionalProperties": False},
    {"type": "object", "propertyNames": {"maxLength": 1}, "additionalProperties": {"const": 1}},
    {"type": "array", "items": {"type": "object", "propertyNames": {"const": "a"},
                                "additionalProperties": {"const": 1}}, "maxItems": 2},
]


@pytest.mark.parametrize("schema", EXACT_SCHEMAS, ids=range(len(EXACT_SCHEMAS)))
def test_mask_is_exact_against_brute_force(schema):
    """'The mask exact at every position (every token the mask allows has a legal completion)':
    along random walks, a token survives the companion exactly when the brute-force search finds
    a complete output with unique names after it; the grammar alone allows some repeats."""
    d = byte_domain()
    constraint = OutputConstraint.json_schema(schema, whitespace="any")
    grammar = ModelCompiler(d).compile(constraint).grammar
    rng = random.Random(3)
    cleared = 0
    for _ in range(4):
        names = json_names_for(constraint, d)
        matcher = grammar.matcher()
        text = bytearray()
        for _ in range(14):
            mask = np.zeros((1, d.mask_words), dtype=np.int32)
            matcher.fill_mask(mask, 0)
            allowed = set(legal_ids(mask[0], d.size))
            cleared += names.apply(mask[0], matcher)
            kept = set(legal_ids(mask[0], d.size))
            for t in sorted(allowed):
                if t in d.eos_ids:
                    continue
                assert matcher.accept_token(t)
                text += d.token_bytes[t]
                good = _completes(matcher, text, 8)
                del text[-len(d.token_bytes[t]):]
                matcher.rollback(1)
                assert (t in kept) is good, (schema, bytes(text), d.token_bytes[t])
            choices = [t for t in kept if t not in d.eos_ids and d.token_bytes[t] in
                       [bytes([b]) for b in WALK_BYTES] + [b'{"', b'":', b'",', b'"}']]
            if not choices:
                break
            t = rng.choice(sorted(choices))
            assert matcher.accept_token(t)
            names.accept(t)
            text += d.token_bytes[t]
    if schema.get("type") == "object" and "minProperties" not in schema:
        assert cleared > 0  # the walks met repeats the grammar alone allowed


def test_rollback_and_prefix_bytes_follow_the_matcher():
    """The companion shares the matcher's transactions: after accepting and rolling back tokens
    its state is the one it had; bytes accepted outside tokens (a continuation prefix) move it."""
    d = byte_domain()
    names = JsonNameConstraint(JsonNameIndex.of(d))
    names.accept_bytes(b'{"a":1')
    base = names.state
    for b in b',"b":2,"':
        names.accept(b)
    assert names.accepted == 8
    names.rollback(3)
    names.rollback(5)
    assert names.state == base
    with pytest.raises(ValueError):
        names.rollback(1)


def test_walks_never_repeat_and_never_dead_end_with_escapes():
    """Random walks over an open name language, escapes included: no text repeats a name once
    unescaped, and no walk reaches a dead end."""
    d = byte_domain()
    for schema in ({"type": "object", "additionalProperties": {"const": 1}},
                   {"type": "object", "propertyNames": {"pattern": "^[a\\\\]{0,2}$"},
                    "additionalProperties": {"const": 0}}):
        constraint = OutputConstraint.json_schema(schema, whitespace="any")
        grammar = ModelCompiler(d).compile(constraint).grammar
        rng = random.Random(11)
        for _ in range(40):
            walk = random_walk(grammar, d, rng, max_tokens=40, end_bias=0.2,
                               names=json_names_for(constraint, d))
            assert not walk.dead_end, walk.data
            assert not repeats_a_name(walk.data), walk.data


def test_after_a_thinking_framing_the_json_starts_at_the_close_token():
    """Design: with thinking on, the output is reasoning, `</think>`, the separator, then the
    content: the reasoning is not JSON (its text repeats what it likes), the content is read from
    the close token on."""
    from shared.frontends import get_domain

    d = byte_domain()
    ctl = d.special_id("<ctl>")
    names = JsonNameConstraint(JsonNameIndex.of(d), start=ctl)
    for b in b'{"a":1,"a":2} ':
        names.accept(b)
    assert names.state[0] == 0 and not names.state[3]  # still waiting: nothing read
    names.accept(ctl)
    for b in b'\n\n{"a":1,':
        names.accept(b)
    assert names.state[3] == (frozenset({b"a"}),)
    qwen = get_domain("qwen3.5")
    framed = json_names_for(OutputConstraint.json_object(), qwen, "qwen-think-v1+raw")
    assert framed.start == qwen.special_id("</think>")
    assert json_names_for(OutputConstraint.json_object(), qwen, "raw").start is None
