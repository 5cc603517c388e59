"""JSON Schema `format` as exact regular languages, against independent checkers.

Every string a random legal walk through a format's grammar completes must pass the independent
checker of that format (jsonschema's format checker with its RFC libraries, and the standard
library's ipaddress / uuid / datetime / base64 where they state the same RFC); hand-picked strings
must be accepted exactly when the checker accepts them, except the documented disagreements
(services/grammar/schema/formats.py), where our language is the intersection (never looser).
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import random
import uuid
import zlib
from functools import lru_cache

import email_validator
import jsonpointer
import jsonschema
import pytest
import xgrammar as xgr

from services.grammar.engines.matching import accepts, random_walk
from services.grammar.schema import check_schema, schema_to_grammar
from shared.errors import UnsupportedSchema
from tests.support.common import byte_domain

CHECKER = jsonschema.Draft202012Validator.FORMAT_CHECKER


@lru_cache(maxsize=1)
def _compiler() -> xgr.GrammarCompiler:
    return xgr.GrammarCompiler(byte_domain().tokenizer_info(), max_threads=1, cache_enabled=False)


@lru_cache(maxsize=None)
def compiled(fmt: str, extra: str = "{}") -> xgr.CompiledGrammar:
    return _compiler().compile_grammar(schema_to_grammar({"type": "string", "format": fmt,
                                                          **json.loads(extra)}))


def _stdlib(fmt: str, s: str) -> bool:
    """The standard library's reading of the same RFC, where it has one."""
    try:
        if fmt == "ipv4":
            ipaddress.IPv4Address(s)
        elif fmt == "ipv6":
            return not ipaddress.IPv6Address(s).scope_id
        elif fmt == "uuid":
            uuid.UUID(s)
        elif fmt == "date":
            datetime.date.fromisoformat(s)
        elif fmt == "date-time":
            datetime.datetime.fromisoformat(s.upper().replace("Z", "+00:00"))
        elif fmt == "byte":
            base64.b64decode(s, validate=True)
        elif fmt == "json-pointer":
            jsonpointer.JsonPointer(s)
        elif fmt == "email":  # jsonschema only looks for "@"; email-validator reads RFC 5321
            email_validator.validate_email(
                s, check_deliverability=False, allow_quoted_local=True, allow_domain_literal=True,
                allow_smtputf8=False, globally_deliverable=False)
        return True
    except (ValueError, email_validator.EmailNotValidError):
        return False


def _relative_json_pointer(s: str) -> bool:
    """draft-handrews-relative-json-pointer-01 section 3, read directly: jsonschema's checker
    refuses any "0" after another digit ("10#", "100/a"), a bug, so it is not the oracle here."""
    digits = len(s) - len(s.lstrip("0123456789"))
    number, rest = s[:digits], s[digits:]
    if not number or (len(number) > 1 and number[0] == "0"):
        return False
    try:
        return rest == "#" or jsonpointer.JsonPointer(rest) is not None
    except jsonpointer.JsonPointerException:
        return False


def independent(fmt: str, s: str) -> bool:
    if fmt == "relative-json-pointer":
        return _relative_json_pointer(s)
    return CHECKER.conforms(s, fmt) and _stdlib(fmt, s)


FORMATS = ["date-time", "date", "time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid",
           "uri", "uri-reference", "json-pointer", "relative-json-pointer", "byte"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_walks_pass_the_independent_checker(fmt):
    """'format: enforce date-time, date, time, duration, email, hostname, ipv4, ipv6, uuid, uri,
    uri-reference ... as exact regular languages from their RFCs'; every completed walk is checked
    by jsonschema's format checker (and the standard library where it reads the same RFC)."""
    grammar = compiled(fmt)
    rng = random.Random(zlib.crc32(fmt.encode()))
    done = 0
    for _ in range(120):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=80, end_bias=0.35)
        assert not walk.dead_end, walk.data
        if walk.completed:
            done += 1
            value = json.loads(walk.data.decode("utf-8"))
            assert independent(fmt, value), (fmt, value)
    assert done >= 10


# (format, strings the RFC and the checkers accept, strings they refuse)
CASES = [
    (
        "date-time",
        ["1963-06-19T08:30:06.283185Z", "2024-02-29t23:59:59+05:30", "0001-01-01T00:00:00-23:59"],
        [
            "2023-02-29T00:00:00Z",
            "1998-12-31T23:59:60Z",
            "2024-01-01 00:00:00Z",
            "2024-01-01T00:00:00",
            "0000-01-01T00:00:00Z",
            "2024-13-01T00:00:00Z",
            "2024-01-01T24:00:00Z",
            "2024-1-01T00:00:00Z",
        ],
    ),
    (
        "date",
        ["2020-02-29", "2000-02-29", "1999-12-31", "2021-04-30"],
        ["1900-02-29", "2021-02-29", "2021-04-31", "2021-4-1", "20210401", "0000-01-01"],
    ),
    (
        "time",
        ["08:30:06Z", "23:59:59.999+01:00", "00:00:00z"],
        ["08:30:06", "24:00:00Z", "23:59:60Z", "8:30:06Z", "08:30:06+24:00"],
    ),
    (
        "duration",
        ["P4DT12H30M5S", "PT1H", "P1W", "P2Y", "PT36H", "P0D", "P1M2D"],
        ["P", "PT", "P1H", "PT1D", "P1Y2W", "1D", "p1d", "P1.5D", "PT1H1S"],
    ),  # ISO 8601 allows the
    # last two (isoduration accepts them); RFC 3339 Appendix A does not
    (
        "email",
        ["a@b.c", "first.last@example.org", '"with space"@x.io', "x@[127.0.0.1]", "t~@e.com"],
        ["plain", "a@", "@b.com", ".a@b.com", "a..b@c.com", "a.@b.com", "a@-b.com"],
    ),
    (
        "hostname",
        ["example.com", "a", "a-b.c-d", "host123", "1.2.3.4"],
        ["-a.com", "a-.com", "a..b", "a.com.", "a_b.com", "a" * 64, "ab--cd.example", "xn--ls8h"],
    ),
    (
        "ipv4",
        ["0.0.0.0", "255.255.255.255", "192.168.1.10"],
        ["256.1.1.1", "01.2.3.4", "1.2.3", "1.2.3.4.5", "1.2.3.-4"],
    ),
    (
        "ipv6",
        [
            "::",
            "::1",
            "1:2:3:4:5:6:7:8",
            "fe80::1:2",
            "::ffff:192.0.2.1",
            "1:2:3:4:5:6:7::",
            "ABCD:ef01::",
        ],
        ["1:2:3:4:5:6:7:8:9", ":::", "1::2::3", "12345::", "fe80::1%eth0", "::ffff:01.2.3.4"],
    ),
    (
        "uuid",
        ["2eb8aa08-aa98-11ea-b4aa-73b441d16380", "2EB8AA08-AA98-11EA-B4AA-73B441D16380"],
        [
            "2eb8aa08aa9811eab4aa73b441d16380",
            "{2eb8aa08-aa98-11ea-b4aa-73b441d16380}",
            "2eb8aa08-aa98-11ea-b4aa-73b441d1638",
            "urn:uuid:2eb8aa08-aa98-11ea-b4aa-73b441d16380",
        ],
    ),
    (
        "uri",
        [
            "http://example.com/a?b=c#d",
            "urn:isbn:0451450523",
            "mailto:x@y.z",
            "ftp://[::1]:21/",
            "http://u:p@h:80/%20",
        ],
        ["//example.com", "/relative", "http://exa mple.com", "1http://x", "http://x/%zz", "a"],
    ),
    (
        "uri-reference",
        ["//example.com", "/relative?x", "#frag", "", "a/b", "http://x"],
        ["\\\\WINDOWS\\share", "#a#b", "http://x/%z", "a b"],
    ),
    ("json-pointer", ["", "/", "/a~1b", "/~0/x/0"], ["a", "/~2", "/~"]),
    ("relative-json-pointer", ["0", "1#", "2/a/b"], ["-1", "01", "/a", "0##"]),
    ("byte", ["", "QUJD", "QUI=", "QQ=="], ["Q", "QUJ", "Q===", "QU=I"]),
]


@pytest.mark.parametrize("fmt,good,bad", CASES, ids=[c[0] for c in CASES])
def test_format_strings_agree_with_the_checkers(fmt, good, bad):
    """Valid strings are accepted, invalid ones refused; both lists are first confirmed by the
    independent checker (leap seconds, which RFC 3339 allows and rfc3339-validator refuses, are
    refused by both; a trailing dot or "--" in a hostname label's 3rd and 4th positions, and the
    ISO 8601 durations outside RFC 3339's ABNF, are documented disagreements: the checker accepts
    them, we refuse)."""
    grammar = compiled(fmt)
    for s in good:
        assert independent(fmt, s), s
        assert accepts(grammar, json.dumps(s)), s
    for s in bad:
        documented = s in ("ab--cd.example", "xn--ls8h", "a.com.", "P1.5D", "PT1H1S")
        assert documented or not independent(fmt, s), s
        assert not accepts(grammar, json.dumps(s)), s


def test_hostname_length_subset():
    """A hostname is at most 63 characters in our language (a strict subset of RFC 1034's 253:
    the exact product automaton is ~24,000 states); the refusals are all the checker's too or
    beyond that documented bound."""
    grammar = compiled("hostname")
    for n in (1, 62, 63):
        name = ("a" * 31 + ".")[: n - 1] + "b"
        assert accepts(grammar, json.dumps(name)) == (len(name) <= 63), name
    assert not accepts(grammar, json.dumps("a" * 30 + "." + "b" * 33))


def test_format_with_pattern_and_length_intersect():
    """'pattern with length through the design document's string-automaton intersection':
    format, pattern and maxLength all hold together."""
    schema = {"type": "string", "format": "date", "pattern": "^2024", "maxLength": 10}
    grammar = _compiler().compile_grammar(schema_to_grammar(schema))
    v = jsonschema.Draft202012Validator(schema, format_checker=CHECKER)
    for s in ["2024-02-29", "2023-02-28", "2024-02-30", "2024-1-01"]:
        assert accepts(grammar, json.dumps(s)) == v.is_valid(s), s
    rng = random.Random(5)
    for _ in range(30):
        walk = random_walk(grammar, byte_domain(), rng, max_tokens=20, end_bias=0.5)
        assert not walk.dead_end
        if walk.completed:
            assert v.is_valid(json.loads(walk.data)), walk.data


def test_const_enum_filtered_by_format():
    """'Finite values ... candidates filtered by the supported sibling assertions'."""
    reduced = check_schema({"type": "string", "format": "ipv4", "enum": ["1.2.3.4", "1.2.3", 7]})
    assert reduced.root.texts == ('"1.2.3.4"',)


def test_openapi_integer_formats_bound_integers():
    """int32/int64 (OpenAPI's format registry) bound integers; format names nobody defines stay
    unsupported, naming the format."""
    grammar = _compiler().compile_grammar(schema_to_grammar({"type": "integer", "format": "int32"}))
    assert accepts(grammar, str(2**31 - 1)) and not accepts(grammar, str(2**31))
    assert accepts(grammar, str(-(2**31))) and not accepts(grammar, str(-(2**31) - 1))
    with pytest.raises(UnsupportedSchema) as info:
        check_schema({"properties": {"c": {"type": "string", "format": "idn-email"}}})
    assert info.value.pointer == "/properties/c/format" and "'idn-email'" in info.value.message


def test_format_applies_only_to_its_type():
    """A string format constrains only strings: other types stay as the schema allows them."""
    grammar = _compiler().compile_grammar(schema_to_grammar({"format": "ipv4"}))
    for text in ['"1.2.3.4"', "12", "null", "[1]"]:
        assert accepts(grammar, text), text
    assert not accepts(grammar, '"1.2.3"')
