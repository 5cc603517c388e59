"""Soundness holes a differential fuzzer found (0 invalid instances accepted is the product's
promise), each a regression test against `jsonschema` (2020-12, format checking) as the oracle.

The rules (services/grammar/schema/patterns.py, "Two readings"; docs/schema-corpus.md,
"Soundness rules"):
a format may be complemented only where its automaton is exactly the validators' language, else
it is refused at its pointer; a pattern generates only strings its ECMA-262 and Python `re`
readings both accept; finite values the readings disagree on are refused.
"""

from __future__ import annotations

import json
import random
import re
from functools import lru_cache

import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import schema_to_grammar
from shared.contract import OutputConstraint
from shared.errors import InvalidRequest, UnsupportedSchema
from tests.support.common import byte_domain


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


def compiled(schema):
    return _compiler().compile_grammar(schema_to_grammar(schema))


def oracle(schema) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)


def text(value) -> str:
    return json.dumps(value, ensure_ascii=False)


def assert_refused(schema, pointer: str) -> UnsupportedSchema:
    with pytest.raises(UnsupportedSchema) as info:
        schema_to_grammar(schema)
    assert info.value.pointer == pointer, info.value.message
    return info.value


def assert_sound(schema, invalid: list, valid: list, walks: int = 12) -> None:
    """Each `invalid` value is invalid for jsonschema and rejected; each `valid` one is valid and
    accepted; random walks through the grammar produce only values jsonschema accepts."""
    grammar, check = compiled(schema), oracle(schema)
    for v in invalid:
        assert not check.is_valid(v), v  # the case is what it claims
        assert not accepts(grammar, text(v)), (schema, v)
    for v in valid:
        assert check.is_valid(v), v
        assert accepts(grammar, text(v)), (schema, v)
    rng = random.Random(7)
    for _ in range(walks):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=40, end_bias=0.5)
        assert not walk.dead_end
        if walk.completed:
            assert check.is_valid(json.loads(walk.data)), (schema, walk.data)


# ---- formats under negation ----------------------------------------------------------------

@pytest.mark.parametrize("schema,pointer", [
    ({"not": {"format": "email"}}, "/not/format"),  # accepted "a@"
    ({"not": {"format": "uuid"}}, "/not/format"),  # "00000000-0000-0000-0000-000000000000}"
    ({"not": {"format": "duration"}}, "/not/format"),  # "PT1H1S"
    ({"not": {"format": "byte"}}, "/not/format"),  # jsonschema does not check it: any string
    ({"oneOf": [{"const": "a."}, {"format": "hostname"}]}, "/oneOf/1/format"),  # accepted "a."
    ({"oneOf": [{"type": "string", "format": "email"}, {"maxLength": 2}]}, "/oneOf/0/format"),
    ({"if": {"format": "email"}, "then": {"type": "integer"}}, "/if/format"),
    ({"type": "object", "propertyNames": {"not": {"format": "email"}}},
     "/propertyNames/not/format"),
    ({"enum": ["a.", "b"], "format": "hostname"}, "/format"),  # fqdn accepts "a."
])
def test_formats_narrower_than_their_checker_are_not_complemented(schema, pointer):
    """'A format may be complemented only where its automaton is exactly the validators'
    language; elsewhere the negated or oneOf-ed format is refused with its pointer' (and a finite
    value the automaton refuses is not decided for the validators either)."""
    assert "format" in assert_refused(schema, pointer).message


def test_exactly_known_formats_are_complemented_soundly():
    """date, ipv4, ipv6, json-pointer, date-time and time are known exactly (formats.py
    VALIDATOR_FORMATS): their complements compile, and what rfc3339-validator also accepts (a
    final newline) is not in the complement."""
    assert_sound({"type": "string", "not": {"format": "ipv4"}}, ["1.2.3.4"], ["1.2.3.256", "x"])
    assert_sound({"type": "string", "not": {"format": "date-time"}},
                 ["2020-01-01T00:00:00Z", "2020-01-01T00:00:00Z\n"], ["2020-01-01", ""])
    assert_sound({"type": "string", "not": {"format": "time"}}, ["10:00:00Z\n"], ["10:00"])
    assert_sound({"oneOf": [{"const": "2020-02-30"}, {"type": "string", "format": "date"}]},
                 [], ["2020-02-30", "2020-02-28"])


def test_hostname_and_uri_complements_are_the_checkers():
    """fqdn's hostnames (lowercased labels of [-A-Z\\d] with IGNORECASE and Unicode digits, a
    final dot, `$`'s final newline, at most 253 characters less the final dot) and
    rfc3986-validator's URIs (IPv4 octets with leading zeros, a final newline) are known exactly
    (formats.validator_language, VALIDATOR_TOO_LONG): their complements compile and leave out
    every value the checker accepts, however far past our narrower automaton."""
    long_name = ".".join(["a" * 63] * 3 + ["a" * 61])  # 253 characters
    assert_sound({"type": "string", "not": {"format": "hostname"}},
                 ["a.", "xn--ab", "a" * 63 + ".b", "\u0663.com", "\u212a.com", "\u0131", "a\n",
                  "A-b.C", long_name, long_name + ".", "b-c.d\n"],
                 ["", "a_b", "-a", "a-", "a..b", ".", "a" * 64, long_name + "a",
                  long_name + ".\n", long_name + "a.", "\u0130.com", "a b", "a.\n\n"])
    assert_sound({"type": "string", "not": {"format": "uri"}},
                 ["http://01.02.03.04/", "s://[::ffff:01.2.3.4]/", "a:b\n", "a:", "s://[v1.a]"],
                 ["a:b c", "1a:b", "//x", "a:\u00e9", "s://[V1.a]", "a:%g0", ""])
    assert_sound({"type": "string", "not": {"format": "uri-reference"}},
                 ["", "a", "//01.2.3.4", "?#", "a:b\n"], ["a b", "%", "\u00e9", "a\n\n"])
    assert_sound({"oneOf": [{"type": "string", "format": "hostname"},
                            {"type": "string", "format": "ipv4"}]},
                 ["1.2.3.4"], ["a.b", "a"])


def _walk(dfa, rng: random.Random, limit: int = 40) -> str | None:
    q, out = 0, []
    for _ in range(limit):
        if q in dfa.accepting and rng.random() < 0.3:
            break
        if not dfa.delta[q]:
            break
        cs, q = rng.choice(dfa.delta[q])
        lo, hi = rng.choice(cs.ranges)
        out.append(chr(rng.randint(lo, min(hi, lo + 300))))
    return "".join(out) if q in dfa.accepting else None


def _mutations(s: str, rng: random.Random) -> list[str]:
    extra = "\n\r {}[]:.-_@/%#?~01aZ9٣éxX+v"
    out = [s + "\n", s[1:], s[:-1]]
    for _ in range(3):
        i = rng.randint(0, len(s))
        out.append(s[:i] + rng.choice(extra) + s[i + 1:])
        out.append(s[:i] + rng.choice(extra) + s[i:])
    return out


def test_format_automata_against_their_checkers():
    """Every format automaton accepts only what jsonschema's checker accepts (positive use is
    sound); where formats.VALIDATOR_FORMATS claims the validators' language, it is exactly the
    checker's on walks through both automata and their mutations."""
    from services.grammar.regex import whole_tree
    from services.grammar.schema import formats
    from services.grammar.schema.automata import dfa_matches, tree_dfa

    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    rng = random.Random(3)
    for name, (regex, limit) in formats.STRING_FORMATS.items():
        ours = tree_dfa(whole_tree(regex))
        theirs = formats.validator_language(name)
        exact = None if theirs is None else tree_dfa(whole_tree(theirs))
        long_name = ".".join(["a" * 63] * 3 + ["a" * 61])
        probes = ["s://[V1.a]", "s://[v1.a]", "100#", "00", "10#", "0", "::1\n", "1.2.3.04",
                  "2020-01-01T00:00:00Z\n", "2020-01-01t00:00:60z", "0000-01-01", "/~2",
                  "http://01.02.03.04/", "s://[::ffff:01.2.3.4]/", "a:b\n", "a:b\n\n", "",
                  "\u0663.com", "\u212a.com", "\u0131.\u017f", "\u0130.com", "a_b", "-a.b",
                  "a-.b", "a.", "a.\n", "a" * 63, "a" * 64, long_name, long_name + ".",
                  long_name + "a", long_name + "a.", long_name + "\n", long_name[1:] + "\n",
                  long_name + ".\n", long_name[1:] + ".\n"]
        for dfa in (ours,) + (() if exact is None else (exact,)):
            for _ in range(80):
                s = _walk(dfa, rng)
                if s is not None:
                    probes += [s] + _mutations(s, rng)
        for s in probes:
            try:
                valid = checker.conforms(s, name)
            except Exception:  # noqa: BLE001 - a checker that raises refuses
                valid = False
            if dfa_matches(ours, s) and (limit is None or len(s) <= limit):
                assert valid, (name, s)
            if exact is not None:
                too_long = any(lo <= len(s) and (hi is None or len(s) <= hi) and
                               (rx is None or re.search(rx, s))
                               for lo, hi, rx in formats.VALIDATOR_TOO_LONG.get(name, ()))
                assert (dfa_matches(exact, s) and not too_long) == valid, (name, s)


# ---- the regex dialect -------------------------------------------------------------------------

def test_negated_patterns_exclude_what_either_reading_matches():
    """'Generate only strings both readings accept': Python's `$` also matches before a final
    newline, its `.` admits U+2028, its \\d is Unicode."""
    assert_sound({"type": "string", "not": {"pattern": "^a$"}}, ["a", "a\n"], ["b", "a\n\n"])
    assert_sound({"type": "string", "not": {"pattern": "."}}, ["\u2028", "\r", "x"], ["", "\n"])
    assert_sound({"type": "string", "not": {"pattern": "\\d"}}, ["٣", "1"], ["a"])


def test_positive_patterns_take_the_intersection_of_the_readings():
    """{"pattern": "\\W"} accepted "é" (ECMA's \\W holds it, Python's does not); \\s differs both
    ways (\\x1c only in Python's, U+FEFF only in ECMA's)."""
    assert_sound({"type": "string", "pattern": "^\\W$"}, ["é", "a"], ["!", " "])
    schema = {"type": "string", "pattern": "^\\s$"}
    grammar = compiled(schema)
    for ch in ("\x1c", "\ufeff"):
        assert not accepts(grammar, text(ch)), repr(ch)
    assert accepts(grammar, text(" "))


def test_pattern_properties_read_both_ways():
    """A name only one reading matches gets neither region: {"a\\n": "x"} is invalid for
    jsonschema (its `^a$` matches "a\\n", so the value must be an integer)."""
    schema = {"type": "object", "patternProperties": {"^a$": {"type": "integer"}},
              "additionalProperties": {"type": "string"}}
    assert_sound(schema, [{"a\n": "x"}, {"a": "x"}], [{"a": 1}, {"b": "x"}])


@pytest.mark.parametrize("schema,pointer", [
    ({"enum": ["é", "a"], "pattern": "\\w"}, "/pattern"),
    ({"not": {"enum": ["é"], "pattern": "\\w"}}, "/not/pattern"),
    ({"type": "string", "pattern": "^(?<n>a)$"}, "/pattern"),  # a lookbehind for Python
    ({"type": "string", "pattern": "\\u{61}"}, "/pattern"),
    ({"type": "string", "pattern": "\\cA"}, "/pattern"),
    ({"type": "string", "pattern": "[^]"}, "/pattern"),
])
def test_patterns_the_readings_disagree_on_are_refused(schema, pointer):
    """Values the two readings decide differently, and constructs Python reads otherwise."""
    assert_refused(schema, pointer)


# ---- wrong "unsatisfiable" refusals ------------------------------------------------------------

def test_complements_of_every_string_are_no_value_not_an_error():
    """{"not": {"type": "string", "pattern": ""}}: 1 is valid; items whose only strings are
    excluded still allow []; an empty pattern inside anyOf leaves the other branch."""
    assert_sound({"not": {"type": "string", "pattern": ""}}, ["x", ""], [1, None, [], {}])
    assert_sound({"type": "array", "items": {"not": {"type": "string", "pattern": "x*"}}},
                 [["a"]], [[], [1]])
    assert_sound({"anyOf": [{"type": "string", "pattern": "[^\\s\\S]"}, {"type": "integer"}]},
                 ["x"], [1])
    # (ipv6 and duration) generates nothing; the other alternative of if/then remains
    assert_sound({"if": {"type": "string", "format": "ipv6"},
                  "then": {"type": "string", "format": "duration"}}, ["::1"], ["P1D", 1, "x"])


def test_an_object_no_name_may_join_is_no_value():
    """propertyNames that no string satisfies with minProperties 1: no object is valid (the
    grammar wrote "{" then two NULs, found by the fuzzer)."""
    for names in (False, {"type": "array"}):
        assert_refused({"type": "object", "propertyNames": names, "minProperties": 1}, "")
        assert_sound({"anyOf": [{"type": "object", "propertyNames": names, "minProperties": 1},
                                {"type": "null"}]}, [{}, {"a": 1}], [None])


# ---- numbers -----------------------------------------------------------------------------------

def test_a_range_without_a_publishable_value_is_refused():
    """'a non-empty range with no publishable value is unsupported' (it compiled to two NULs)."""
    assert_refused({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5e-324},
                   "/exclusiveMaximum")
    assert_refused({"allOf": [{"type": "number", "exclusiveMinimum": 0},
                              {"exclusiveMaximum": 5e-324}]}, "/allOf/1")
    tiny = {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1e-10}
    assert_sound(tiny, [0, 1e-10], [])
    assert accepts(compiled(tiny), "0.00000000005")


@pytest.mark.parametrize("source,pointer", [
    ('{"const": 12345678901234567891234.5}', "/const"),
    ('{"type": "number", "maximum": 0.10000000000000000000001}', "/maximum"),
    ('{"enum": [1, 1e-400]}', "/enum/1"),
    ('{"type": "string", "minLength": 2.00000000000000000001}', "/minLength"),
])
def test_numbers_json_parsing_rounds_are_refused(source, pointer):
    """'Numeric assertions or const/enum values that JSON parsing would round are rejected when
    the source is read; annotation fields ... are not so restricted.'"""
    with pytest.raises(UnsupportedSchema) as info:
        schema_to_grammar(OutputConstraint.json_schema(source).schema)
    assert info.value.pointer == pointer and "rounded" in info.value.message
    annotated = OutputConstraint.json_schema('{"type": "number", "default": 0.1000000000000000001}')
    assert "0.1000000000000000001" in annotated.source  # kept as written
    schema_to_grammar(annotated.schema)


def test_a_number_beyond_binary64_is_a_typed_error():
    with pytest.raises(InvalidRequest) as info:
        OutputConstraint.json_schema('{"maximum": 1e400}')
    assert info.value.field == "json_schema"


# ---- duplicate names (refused where no name companion runs) -------------------------------------

@pytest.mark.parametrize("schema,pointer", [
    ({"minProperties": 2}, "/minProperties"),  # accepted {"a":1,"a":2}
    ({"type": "object", "not": {"maxProperties": 1}}, "/not"),
    ({"type": "object", "if": {"maxProperties": 1}, "then": False}, "/if"),
    ({"type": "array", "items": {"type": "object", "minProperties": 2}}, "/items/minProperties"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}, "minProperties": 2}, "/minProperties"),
    ({"allOf": [{"type": "object"}, {"minProperties": 3, "required": ["a"]}]},
     "/allOf/1/minProperties"),
])
def test_counts_undeclared_names_could_fill_by_repeating_are_refused(schema, pointer):
    """'No generated object may repeat a name (the grammar counts copies as separate members)':
    where no JSON name companion runs beside the matcher (`unique_names` off: tool-call
    arguments), a minimum count that undeclared names would have to fill beyond one member is
    refused at its pointer; content JSON compiles it (test_grammar_json_names.py)."""
    assert "repeat a name" in assert_refused(schema, pointer).message
    schema_to_grammar(schema, unique_names=True)  # content: the companion keeps names unique


def test_counts_that_one_free_member_meets_still_compile():
    """Members beyond the required ones count safely while one free member suffices."""
    assert_sound({"type": "object", "required": ["a"], "minProperties": 2},
                 [{"a": 1}, {}], [{"a": 1, "b": 2}])
    assert_sound({"type": "object", "properties": {"a": {}, "b": {}},
                  "additionalProperties": False, "minProperties": 2},
                 [{"a": 1}], [{"a": 1, "b": 1}])
    grammar = compiled({"type": "object", "minProperties": 1})
    assert accepts(grammar, '{"a": 1}') and not accepts(grammar, "{}")


def test_hostnames_63_character_bound_proves_no_disjointness():
    """fqdn accepts hostnames of up to 253 characters; our automaton's 63 is not a length the
    validators read, so it no longer sits in maxLength where a length proof would see it: oneOf
    [hostname, minLength 64] was 'disjoint by length' and accepted "a" * 63 + ".b", which both
    branches take (invalid). Now the second branch excludes the checker's hostnames."""
    schema = {"oneOf": [{"type": "string", "format": "hostname"},
                        {"type": "string", "minLength": 64}]}
    assert not oracle(schema).is_valid("a" * 63 + ".b")
    from services.grammar.schema import check_schema

    root = check_schema(schema).root
    assert any(p.negated and p.fmt == "hostname" for b in root.branches for p in b.patterns)
