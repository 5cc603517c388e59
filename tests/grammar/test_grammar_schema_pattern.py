"""JSON Schema `pattern` against `jsonschema` as the independent validator.

`jsonschema` checks `pattern` with Python's `re.search`, whose \\d \\w \\s `.` and `$` differ from
ECMAScript's. Each case therefore carries a Python pattern written by hand from the ECMAScript
definitions (\\d = [0-9], \\w = [0-9A-Za-z_], \\s = WhiteSpace + LineTerminator, `.` excludes
\\n \\r U+2028 U+2029, `$` = end of input = Python's \\Z). The rule (patterns.py, "Two
readings"): only strings both readings accept are generated, so the oracle is jsonschema with that
pattern AND jsonschema with the schema's own pattern (Python's reading).
"""

from __future__ import annotations

import json
import random
import time
import zlib
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import schema_to_grammar
from shared.errors import InvalidSchema, UnsupportedSchema
from shared.frontends.token_domain import TokenDomain
from tests.support.common import byte_domain

ES_SPACE = "\\t-\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff"

# (ECMAScript pattern as the schema holds it, the same language as a Python `re.search` pattern)
CASES = [
    ("", ""),
    ('["\\\\]x', '["\\\\]x'),
    ("^[\\x00-\\x1f]+$", "^[\\x00-\\x1f]+\\Z"),
    ("[^a-z]", "[^a-z]"),
    ("^é|ü$|中", "^é|ü\\Z|中"),
    ("^\\d{2,4}$", "^[0-9]{2,4}\\Z"),
    ("\\w+@\\w", "[0-9A-Za-z_]+@[0-9A-Za-z_]"),
    ("^\\s+x$", f"^[{ES_SPACE}]+x\\Z"),
    ("a.c", "a[^\\n\\r\\u2028\\u2029]c"),
    ("^(ab|cd)*$", "^(ab|cd)*\\Z"),
    ("^x|y$", "^x|y\\Z"),
    ("^$", "^\\Z"),
    ('[\\t\\n"]{2}', '[\\t\\n"]{2}'),
    ("^\\u00e9+\U0001F600?$", "^\\u00e9+\\U0001F600?\\Z"),
    ("^(?:\\\\|/)+$", "^(?:\\\\|/)+\\Z"),
    ("^\\D\\W$", "^[^0-9][^0-9A-Za-z_]\\Z"),
    ("^a[^\\s\\S]|c$", "^a[^\\s\\S]|c\\Z"),  # a branch that matches nothing: never entered
    ("^[^\\S\\n]$", ("^[\\t\\x0b-\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f"
                      "\\u3000\\ufeff]\\Z")),
]

# Strings every case is probed with, besides mutations of the walks' outputs.
PROBES = ["", "a", "x", "y", "xy", "ab", "abcd", "abc", "a c", "a\nc", "a\rc", "a\u2028c", "abd",
          "12", "123", "12345", "1a", "٣٣", "é", "éé😀", "😀", "ü", "中", "\n", "\r", "\t", "\t\n",
          '"', '"x', "\\x", "\\", "/\\/", "\x00\x1f", "\x1f", "\x7f", "\x1c", " x", "\u3000x",
          "\ufeffx", "\x85x", "a@b", "@b", "a_@_", "\u2028", "%&", "a\n", "x\n", "\x0b", " "]


# One token per canonical unit of a small alphabet (and the bare quote): random walks find the
# needles of unanchored patterns here, while byte_domain() walks cross UTF-8 and escape boundaries.
ALPHABET = "abcdxy1@_/ \u00e9\u00fc\u4e2d\U0001f600\n\t\r\x1f\x00\"\\\u2028\u3000"


@lru_cache(maxsize=1)
def alphabet_domain() -> TokenDomain:
    tokens = [b'"'] + [json.dumps(c, ensure_ascii=False)[1:-1].encode() for c in ALPHABET]
    tokens.append(b"<eos>")
    eos = len(tokens) - 1
    return TokenDomain(name="alphabet-test", token_bytes=tuple(tokens), size=len(tokens),
                       eos_ids=frozenset({eos}), control_ids=frozenset(),
                       special_names=(("<eos>", eos),))


@lru_cache(maxsize=2)
def _compiler(domain: TokenDomain) -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(domain.tokenizer_info(), max_threads=1, cache_enabled=False)


def compile_schema(schema, domain: TokenDomain | None = None) -> xgr.CompiledGrammar:
    return _compiler(domain or byte_domain()).compile_grammar(schema_to_grammar(schema))


def encode(value: str) -> str:
    """The canonical JSON string (the form json.dumps writes without ASCII escaping)."""
    return json.dumps(value, ensure_ascii=False)


def _mutations(value: str, rng: random.Random) -> list[str]:
    out = [value[1:], value[:-1], value + "\n", "q" + value]
    if value:
        i = rng.randrange(len(value))
        out.append(value[:i] + rng.choice(["a", '"', "\\", "\n", "é", "1", " "]) + value[i + 1:])
    return out


class Both:
    """Valid for the ECMAScript reading (`py`, its Python transcription) and for jsonschema's own
    reading of the schema's pattern."""

    def __init__(self, py: str, pattern: str, **rest) -> None:
        self.ecma = jsonschema.Draft202012Validator({"type": "string", "pattern": py, **rest})
        self.python = jsonschema.Draft202012Validator({"type": "string", "pattern": pattern,
                                                       **rest})

    def is_valid(self, value) -> bool:
        return self.ecma.is_valid(value) and self.python.is_valid(value)

    def agree(self, value) -> bool:
        return self.ecma.is_valid(value) == self.python.is_valid(value)


@pytest.mark.parametrize("pattern,py", CASES, ids=[c[0] or "empty" for c in CASES])
def test_pattern_walks_validate_and_probes_agree(pattern, py):
    """'pattern matches string values with schema (search) semantics'; 'String length and pattern
    grammars use canonical JSON escapes'; 'Dot and whitespace classes follow ECMAScript'."""
    grammar = schema_to_grammar({"type": "string", "pattern": pattern})
    oracle = Both(py, pattern)
    rng = random.Random(zlib.crc32(pattern.encode()))
    completed, probes = 0, list(PROBES)
    for domain, tries, steps in ((alphabet_domain(), 24, 64), (byte_domain(), 6, 24)):
        compiled = _compiler(domain).compile_grammar(grammar)  # the byte domain's comes last
        for _ in range(tries):
            walk = random_walk(compiled, domain, rng, max_tokens=steps, end_bias=0.6)
            assert not walk.dead_end, walk.data
            if not walk.completed:
                continue
            completed += 1
            text = walk.data.decode("utf-8")
            value = json.loads(text)
            assert encode(value) == text, text  # the canonical escape form, nothing else
            assert oracle.is_valid(value), (pattern, text)
            probes += _mutations(value, rng)
            if completed >= 5:
                break
    assert completed > 0
    for value in probes:
        assert accepts(compiled, encode(value)) == oracle.is_valid(value), (pattern, value)


def test_non_canonical_escapes_are_rejected():
    """'String length and pattern grammars use canonical JSON escapes; a continuation must be a
    prefix of this generation language': only json.dumps's form of each character is generated."""
    for pattern, canonical, others in [
        ("^a$", '"a"', ['"\\u0061"']),
        ('^"$', '"\\""', ['"\\u0022"']),
        ("^/$", '"/"', ['"\\/"', '"\\u002f"']),
        ("^\\x1f$", '"\\u001f"', ['"\\u001F"']),
        ("^\\n$", '"\\n"', ['"\\u000a"']),
        ("^é$", '"é"', ['"\\u00e9"']),
    ]:
        compiled = compile_schema({"type": "string", "pattern": pattern})
        assert json.loads(canonical) == json.loads(others[0])  # the same decoded value
        assert encode(json.loads(canonical)) == canonical
        assert accepts(compiled, canonical), pattern
        for other in others:
            assert not accepts(compiled, other), (pattern, other)


@pytest.mark.parametrize("pattern,py", [CASES[5], CASES[7], CASES[8], CASES[9], CASES[-1]],
                         ids=["digits", "space", "dot", "repeat", "not-space"])
def test_enum_values_filtered_by_pattern(pattern, py):
    """'Finite const/enum candidates [are] filtered by the supported sibling assertions, including
    ... string': the filter keeps the values both readings accept, and a value the readings decide
    differently is refused at the pattern (either decision could be wrong for some validator)."""
    both = Both(py, pattern)
    disputed = [p for p in PROBES if p and not both.agree(p)]
    for v in disputed:
        with pytest.raises(UnsupportedSchema) as info:
            schema_to_grammar({"type": "string", "pattern": pattern, "enum": ["", v]})
        assert info.value.pointer == "/pattern", (pattern, v)
    values = [p for p in PROBES if p and both.agree(p)]
    expected = [v for v in values if both.is_valid(v)]
    schema = {"type": "string", "pattern": pattern, "enum": values}
    if not expected:
        with pytest.raises(UnsupportedSchema):
            schema_to_grammar(schema)
        return
    compiled = compile_schema(schema)
    for v in values:
        assert accepts(compiled, encode(v)) == (v in expected), (pattern, v)
    const = compile_schema({"const": expected[0], "pattern": pattern})
    assert accepts(const, encode(expected[0]))


def test_enum_filter_does_not_backtrack():
    """'Composition compilation has explicit limits': filtering a value by a pattern is linear in
    the value for a fixed pattern, even where a backtracking engine is exponential."""
    bad = "a" * 40 + "!"
    start = time.perf_counter()
    with pytest.raises(UnsupportedSchema):  # no candidate survives: unsatisfiable
        schema_to_grammar({"enum": [bad], "pattern": "^(a|a)*$"})
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize("schema,pointer,error", [
    ({"type": "string", "pattern": "(?<=a)b"}, "/pattern", UnsupportedSchema),
    ({"type": "string", "pattern": "\\bword"}, "/pattern", UnsupportedSchema),
    ({"properties": {"p": {"pattern": "a(?=b)"}}}, "/properties/p/pattern", UnsupportedSchema),
    ({"type": "string", "pattern": "a)"}, "/pattern", InvalidSchema),
    ({"type": "string", "pattern": "[b-a]"}, "/pattern", InvalidSchema),
    ({"type": "string", "pattern": "^a{3}$", "maxLength": 2}, "", UnsupportedSchema),
    ({"type": "string", "pattern": "a", "maxLength": 9000}, "/pattern", UnsupportedSchema),
    ({"type": "string", "pattern": "x[^\\s\\S]"}, "", UnsupportedSchema),  # no value: the root
    ({"allOf": [{"pattern": "^a"}, {"type": "string", "pattern": "^b"}]}, "", UnsupportedSchema),
])
def test_pattern_errors_carry_the_pointer(schema, pointer, error):
    """'back-references, zero-width assertions, Unicode property classes, surrogate escapes and
    unknown escapes are unsupported'; 'an intersection that cannot compile is unsupported';
    a pattern that matches nothing is unsatisfiable 'rather than having the constraint dropped'.
    A string intersection (pattern and length, several patterns) that matches nothing is no value
    where it stands, so a schema with nothing else left is unsatisfiable at its root, the message
    naming the pattern."""
    with pytest.raises(error) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer, info.value.message
    if pointer == "":
        assert "unsatisfiable" in info.value.message and "pattern'" in info.value.message


def test_an_empty_string_intersection_is_no_value_where_it_stands():
    """An optional member or a union branch whose string intersection matches nothing drops out
    (jsonschema agrees: no string satisfies it), instead of refusing the whole schema."""
    schema = {"type": "object", "properties": {
        "a": {"type": "string", "pattern": "^a{3}$", "maxLength": 2},
        "b": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^x", "maxLength": 0}]}}}
    compiled = compile_schema(schema)
    for value in [{}, {"b": 3}, {"a": "aaa"}, {"a": "aa"}, {"b": "x"}, {"b": ""}]:
        assert accepts(compiled, json.dumps(value, separators=(",", ":"))) == \
            jsonschema.Draft202012Validator(schema).is_valid(value), value


def test_pattern_inside_objects_and_unions():
    """'pattern matches string values with schema (search) semantics' wherever the string sits."""
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}\\d$"},
                                               "t": {"anyOf": [{"type": "integer"},
                                                               {"pattern": "x"}]}},
              "required": ["id"], "additionalProperties": False}
    oracle = jsonschema.Draft202012Validator(
        {**schema, "properties": {"id": {"type": "string", "pattern": "^[A-Z]{2}[0-9]\\Z"},
                                  "t": schema["properties"]["t"]}})
    compiled = compile_schema(schema)
    for text in ['{"id": "AB1"}', '{"id": "AB1", "t": 3}', '{"id": "ZZ9", "t": "axb"}',
                 '{"id": "ab1"}', '{"id": "AB12"}', '{"id": "AB1", "t": "ab"}',
                 '{"id": "AB1", "t": true}', '{"id": "AB1", "t": null}']:
        assert accepts(compiled, text) == oracle.is_valid(json.loads(text)), text
