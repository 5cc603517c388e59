"""`format` as exact regular languages, written as whole-match regular expressions for our parser.

Each string format is the language of its RFC's ABNF (case-sensitive where the RFC text or the
common checkers are; see below), expressed in the regex subset of `services.grammar.regex` and
enforced like an anchored `pattern` (`Pattern(..., whole=True)`), so const/enum filtering, the
grammar and the length intersection all use one tree. Where an RFC allows what `jsonschema`'s
format checkers refuse, we take the intersection, never the union (the language is never looser
than either):

- date-time / time (RFC 3339 5.6): the leap second `:60` and year 0000 are refused
  (rfc3339-validator refuses both); `T` and `Z` may be lowercase (RFC 3339 5.6 NOTE).
- date (RFC 3339 full-date): February 29 only in leap years; year 0000 refused (datetime.date).
- duration (RFC 3339 Appendix A): designators uppercase only (ISO 8601; isoduration).
- hostname (RFC 1123 2.1 labels, RFC 1034 3.1 length): labels of 1..63 letters, digits and inner
  hyphens, the whole name at most 63 characters (RFC: 253; see HOSTNAME_MAX), no trailing dot;
  labels with "--" in their 3rd
  and 4th positions are refused (IDNA2008's reserved labels: the test suite refuses invalid
  "xn--" A-labels, whose validity is not a small regular language).
- email (RFC 5321 4.1.2 Mailbox): dot-string or quoted local part, a domain or an address literal;
  the size limits of RFC 5321 4.5.3.1 are not applied (they are implementation minimums).
- ipv4 (RFC 2673 dotted-quad, no leading zeros), ipv6 (RFC 4291 2.2, the RFC 3986 IPv6address
  production; no zone identifier), uuid (RFC 4122 3, hex digits of either case), uri and
  uri-reference (RFC 3986, ASCII; an IPvFuture literal with a lowercase "v", as rfc3987-syntax
  reads it), json-pointer (RFC 6901), relative-json-pointer (its draft; jsonschema's checker
  refuses a digit after a "0", e.g. "100#", so those integers are not generated).
- OpenAPI's registry, applied to the type it is defined for: int8..int64 and uint8..uint64
  (integer ranges on numbers), float/double (numbers; no constraint beyond finite binary64),
  byte (RFC 4648 base64), binary and password (any string).

- regex: a regular subset of the expressions both ECMAScript and Python's `re` compile (see
  REGEX); draft-03's color: hex triplets and the CSS 2.1 names; draft-03's utc-millisec: any
  number. Draft-03's formats are enforced in every dialect (the later dialects' validators ignore
  them, so the generated values are valid in both readings).

Formats a JSON Schema specification defines (draft-03 to 2020-12) that are not reduced here
(idn-*, iri*, uri-template, draft-03's style and phone) are
UnsupportedSchema: validators check them, and we cannot execute the assertion.

Any other name is an unknown format, which no specification makes an assertion: draft-04 7.2 and
draft-06/07 ("schema authors SHALL NOT expect a peer implementation to support ... custom format
attributes"), 2019-09/2020-12 (format is an annotation unless a vocabulary asserts it, and only the
defined formats are then asserted); the JSON-Schema-Test-Suite's optional/format/unknown cases have
every instance valid, and `jsonschema`'s format checker ignores such names. An unknown format is
therefore read as an annotation, listed as `format:<name>` in the compile result's annotations
(never silently), with one guard, the same as for keywords (dialects.near_miss): a name within one
case change or one edit of a defined or supported format (`url` for `uri`, `datetime`,
`Date-Time`, `guid` for `uuid`) was meant as that format by its author, and is enforced as the
format it resembles where that is one reduced here (the declared reading accepts every string, so
the generated values are valid in both; listed as `format:<name>=<format>`, and refused under a
complement, as misspelt.py does for keywords); draft-03's `host-name` and `ip-address`, which
later drafts' validators do not check, are read the same way as `hostname` and `ipv4`. A
near-miss of a format that is not reduced stays UnsupportedSchema naming it.
"""

from __future__ import annotations

from functools import lru_cache

from services.grammar.schema.dialects import one_edit

_DIGIT = "[0-9]"
_HEX = "[0-9A-Fa-f]"

# ---- RFC 3339
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"
_LEAP_YEAR = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_MONTH_DAY = ("(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])"
              "|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
              "|02-(?:0[1-9]|1[0-9]|2[0-8]))")
DATE = f"(?:{_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
TIME = ("(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]+)?"
        "(?:[Zz]|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
DATE_TIME = f"{DATE}[Tt]{TIME}"
_DUR_TIME = "T(?:[0-9]+H(?:[0-9]+M(?:[0-9]+S)?)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
DURATION = (f"P(?:(?:[0-9]+D|[0-9]+M(?:[0-9]+D)?|[0-9]+Y(?:[0-9]+M(?:[0-9]+D)?)?)(?:{_DUR_TIME})?"
            f"|{_DUR_TIME}|[0-9]+W)")

# ---- addresses
_DEC_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
IPV4 = f"(?:{_DEC_OCTET}\\.){{3}}{_DEC_OCTET}"
_H16 = f"{_HEX}{{1,4}}"
_LS32 = f"(?:{_H16}:{_H16}|{IPV4})"
IPV6 = "(?:" + "|".join([
    f"(?:{_H16}:){{6}}{_LS32}",
    f"::(?:{_H16}:){{5}}{_LS32}",
    f"(?:{_H16})?::(?:{_H16}:){{4}}{_LS32}",
    f"(?:(?:{_H16}:){{0,1}}{_H16})?::(?:{_H16}:){{3}}{_LS32}",
    f"(?:(?:{_H16}:){{0,2}}{_H16})?::(?:{_H16}:){{2}}{_LS32}",
    f"(?:(?:{_H16}:){{0,3}}{_H16})?::{_H16}:{_LS32}",
    f"(?:(?:{_H16}:){{0,4}}{_H16})?::{_LS32}",
    f"(?:(?:{_H16}:){{0,5}}{_H16})?::{_H16}",
    f"(?:(?:{_H16}:){{0,6}}{_H16})?::",
]) + ")"
UUID = f"{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}"
# "--" in the 3rd and 4th positions (IDNA2008 reserved / A-labels) refused. No label length bound
# here: the whole name is at most HOSTNAME_MAX = 63 characters, so every label is too.
_LABEL = ("(?:[A-Za-z0-9]{1,2}|[A-Za-z0-9][A-Za-z0-9-]{1,2}[A-Za-z0-9]"
          "|[A-Za-z0-9][A-Za-z0-9-](?:[A-Za-z0-9][A-Za-z0-9-]|-[A-Za-z0-9])[A-Za-z0-9-]*[A-Za-z0-9])")
HOSTNAME = f"{_LABEL}(?:\\.{_LABEL})*"
# RFC 1034 allows 253 characters in all, but labels of <= 63 and a total of <= 253 together need a
# product automaton of ~24,000 states (measured): we generate hostnames of at most 63 characters,
# for which the label bound holds by itself (a strict subset: never a looser language).
HOSTNAME_MAX = 63

# ---- RFC 5321 Mailbox
_ATEXT = "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]"
_LOCAL = (
    f'(?:{_ATEXT}+(?:\\.{_ATEXT}+)*|"(?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e]|\\\\[\\x20-\\x7e])*")'
)
_SUBDOMAIN = "[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_ADDRESS_LITERAL = f"\\[(?:{IPV4}|[A-Za-z0-9-]*[A-Za-z0-9]:[\\x21-\\x5a\\x5e-\\x7e]+)\\]"
EMAIL = f"{_LOCAL}@(?:{_SUBDOMAIN}(?:\\.{_SUBDOMAIN})*|{_ADDRESS_LITERAL})"

# ---- RFC 3986
_PCT = f"%{_HEX}{{2}}"
_UNRESERVED_SUB = "A-Za-z0-9._~!$&'()*+,;=\\-"
_PCHAR = f"(?:[{_UNRESERVED_SUB}:@]|{_PCT})"
_SEGMENT_NZ_NC = f"(?:[{_UNRESERVED_SUB}@]|{_PCT})+"
_USERINFO = f"(?:[{_UNRESERVED_SUB}:]|{_PCT})*"
_REG_NAME = f"(?:[{_UNRESERVED_SUB}]|{_PCT})*"
_IP_LITERAL = f"\\[(?:{IPV6}|v{_HEX}+\\.[{_UNRESERVED_SUB}:]+)\\]"
_AUTHORITY = f"(?:{_USERINFO}@)?(?:{_IP_LITERAL}|{_REG_NAME})(?::[0-9]*)?"
_PATH_ABEMPTY = f"(?:/{_PCHAR}*)*"
_PATH_ABSOLUTE = f"/(?:{_PCHAR}+(?:/{_PCHAR}*)*)?"
_PATH_ROOTLESS = f"{_PCHAR}+(?:/{_PCHAR}*)*"
_PATH_NOSCHEME = f"{_SEGMENT_NZ_NC}(?:/{_PCHAR}*)*"
_QUERY_FRAGMENT = f"(?:\\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"
URI = (f"[A-Za-z][A-Za-z0-9+.-]*:(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_ROOTLESS})?"
       f"{_QUERY_FRAGMENT}")
_RELATIVE_REF = (f"(?://{_AUTHORITY}{_PATH_ABEMPTY}|{_PATH_ABSOLUTE}|{_PATH_NOSCHEME})?"
                 f"{_QUERY_FRAGMENT}")
URI_REFERENCE = f"(?:{URI}|{_RELATIVE_REF})"

# ---- RFC 6901 and relative JSON pointers (draft-handrews-relative-json-pointer-01)
JSON_POINTER = "(?:/(?:[^/~]|~[01])*)*"
# jsonschema refuses a digit after a "0" ("100", "00"): the integer part is narrowed to agree.
RELATIVE_JSON_POINTER = f"(?:0|[1-9]+0?)(?:#|{JSON_POINTER})"

BYTE = "(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?"

# ---- regex (ECMA-262; jsonschema's checker is Python's re.compile): a regular subset valid in
# both, ECMAScript with or without the u flag and Python: literals other than the syntax
# characters, escaped syntax characters and `/`, `\d \w \s` and negations, `.`, classes of
# such characters and the ranges a-z, A-Z, 0-9, one quantifier `* + ? {m} {m,}` per atom (lazy or
# not), groups one level deep, `^` and `$` at the ends of top-level alternatives. Not `-` escaped
# outside a class (an error with the u flag), not `{m,n}` (out of order is an error), not `[` `|`
# `&` `~` inside a class (Python warns of set operations).
_RX_LIT = "[^\\\\^$.|?*+()\\[\\]{}]"
_RX_ESC = "\\\\[\\\\^$.|?*+()\\[\\]{}/dDwWsS]"
_RX_CLASS_ATOM = "(?:[^\\\\\\]\\[^|&~\\-]|\\\\[\\\\\\]\\[^\\-dDwWsS]|a-z|A-Z|0-9)"
_RX_CLASS = f"\\[\\^?{_RX_CLASS_ATOM}+\\]"
_RX_QUANT = "(?:(?:[*+?]|\\{[0-9]{1,3},?\\})\\??)?"
_RX_ATOM = f"(?:(?:{_RX_LIT}|{_RX_ESC}|\\.|{_RX_CLASS}){_RX_QUANT})"
_RX_GROUP = f"(?:\\((?:\\?:)?{_RX_ATOM}*(?:\\|{_RX_ATOM}*)*\\){_RX_QUANT})"
_RX_ALTERNATIVE = f"\\^?(?:{_RX_ATOM}|{_RX_GROUP})*\\$?"
REGEX = f"{_RX_ALTERNATIVE}(?:\\|{_RX_ALTERNATIVE})*"

# ---- draft-03 color (CSS 2.1; jsonschema's draft-03 checker is webcolors): hex triplets and the
# CSS 2.1 names in lowercase, a subset of what webcolors accepts.
_CSS21 = ("aqua", "black", "blue", "fuchsia", "gray", "green", "lime", "maroon", "navy", "olive",
          "orange", "purple", "red", "silver", "teal", "white", "yellow")
COLOR = f"(?:#{_HEX}{{3}}|#{_HEX}{{6}}|{'|'.join(_CSS21)})"

# name -> (whole-match regex, maximum length or None)
STRING_FORMATS: dict[str, tuple[str, int | None]] = {
    "date-time": (DATE_TIME, None), "date": (DATE, None), "time": (TIME, None),
    "duration": (DURATION, None), "email": (EMAIL, None), "hostname": (HOSTNAME, HOSTNAME_MAX),
    "ipv4": (IPV4, None), "ipv6": (IPV6, None), "uuid": (UUID, None), "uri": (URI, None),
    "uri-reference": (URI_REFERENCE, None), "json-pointer": (JSON_POINTER, None),
    "relative-json-pointer": (RELATIVE_JSON_POINTER, None), "byte": (BYTE, None),
    "regex": (REGEX, None), "color": (COLOR, None),
}
# Formats whose language for the validators (`jsonschema`'s checkers with the format-nongpl
# libraries, e.g. Python's ipaddress, datetime, rfc3339-validator) is known exactly as a regular
# language, each checked by differential tests: these alone may be complemented (`not`, `oneOf`,
# `if`/`else`) or decided on a finite value the automaton refuses. The value is the validators'
# language where it is wider than ours (a `$` anchor in rfc3339-validator also admits a final
# newline), else the same regex. Every other format is narrower than its checker (fqdn's hostnames,
# "@" for email, uuid.UUID's braces, isoduration, rfc3987's URIs) or unchecked (`byte`).
# rfc3986-validator (jsonschema's uri / uri-reference checker without the GPL rfc3987) is our
# RFC 3986 grammar with IPv4 octets that may have leading zeros, anchored by `$` (a final newline):
# the same automaton as its compiled regex (a differential test checks it on walks of both).
_VALIDATOR_OCTET = "(?:25[0-5]|2[0-4][0-9]|[01]?[0-9][0-9]?)"
VALIDATOR_FORMATS: dict[str, str] = {
    "date": DATE, "ipv4": IPV4, "ipv6": IPV6, "json-pointer": JSON_POINTER,
    "date-time": f"{DATE_TIME}\n?", "time": f"{TIME}\n?",
    "uri": URI.replace(_DEC_OCTET, _VALIDATOR_OCTET) + "\n?",
    "uri-reference": URI_REFERENCE.replace(_DEC_OCTET, _VALIDATOR_OCTET) + "\n?",
}
# fqdn (jsonschema's hostname checker) lowercases the name, then matches labels of 1..63
# characters of `[-A-Z\d]` (IGNORECASE, Python's Unicode \d) not starting or ending with "-",
# joined by dots, an optional final dot, `$` (a final newline); and the name, less a final dot,
# has at most 253 characters. The label part is `validator_language("hostname")`; the length part
# is `VALIDATOR_TOO_LONG`: its complement, the strings too long for the checker, which a
# complement of the format adds (applicators.complement): 255 characters and more, or 254 not
# ending with a dot.
VALIDATOR_TOO_LONG: dict[str, tuple[tuple[int, int | None, str | None], ...]] = {
    "hostname": ((255, None, None), (254, 254, "[^.]$")),
}


def validator_language(fmt: str | None) -> str | None:
    """The validators' language of format `fmt` as a whole-match regex where it is known
    (VALIDATOR_FORMATS, and hostname's labels up to VALIDATOR_TOO_LONG), else None."""
    if fmt == "hostname":
        return _fqdn_labels()
    return VALIDATOR_FORMATS.get(fmt) if fmt is not None else None


@lru_cache(maxsize=1)
def _fqdn_labels() -> str:
    import re

    from services.grammar.regex.charset import CharSet, regex_class

    # the characters whose lowercase is one character the label class matches: the ASCII
    # letters and digits, Python's Unicode \d, and the letters case-insensitive matching relates
    # to ASCII ones (K KELVIN SIGN, dotless i, long s); read from sre itself over every scalar
    label = re.compile(r"[-A-Z\d]", re.IGNORECASE)
    text = "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))
    chars = {ord(c) for c in (m.group() for m in label.finditer(text))
             if len(c.lower()) == 1 and label.fullmatch(c.lower())}
    inner = CharSet.of([(c, c) for c in sorted(chars - {0x2D})])
    any_ = CharSet.of([(c, c) for c in sorted(chars | {0x2D})])
    d, a = regex_class(inner), regex_class(any_)
    one = f"(?:{d}(?:{a}{{0,61}}{d})?)"
    return f"(?:{one}\\.)*{one}\\.?\n?"
# Formats that assert nothing for the type they apply to (OpenAPI: descriptive).
# draft-03's utc-millisec is any number (milliseconds since the epoch) and not a string format.
STRING_NO_CONSTRAINT = frozenset({"binary", "password", "utc-millisec"})
# OpenAPI integer formats: inclusive ranges.
# OpenAPI's format registry also names the other widths; uint64 is cut at the int64 maximum (the
# generated integers are signed 64-bit: narrower, never looser). `jsonschema` checks none of them,
# so enforcing them generates values valid in both readings.
INTEGER_FORMATS = {"int32": (-(2**31), 2**31 - 1), "int64": (-(2**63), 2**63 - 1),
                   "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1),
                   "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1),
                   "uint64": (0, 2**63 - 1)}
NUMBER_NO_CONSTRAINT = frozenset({"float", "double", "utc-millisec"})
KNOWN = frozenset(STRING_FORMATS) | STRING_NO_CONSTRAINT | frozenset(INTEGER_FORMATS) | \
    NUMBER_NO_CONSTRAINT

# Draft-03 names of formats later drafts renamed: their validators check the new name only, so the
# old one is read as the format it names (typed._format), as a near-miss is.
READ_AS = {"host-name": "hostname", "ip-address": "ipv4"}

# Formats the specifications define (draft-03 .. 2020-12) that are not reduced here.
SPEC_UNREDUCED = frozenset({
    "idn-email", "idn-hostname", "iri", "iri-reference", "uri-template",
    "style", "phone",
})
_RESEMBLED = sorted(KNOWN | SPEC_UNREDUCED)


def resembles(name: str) -> str | None:
    """The defined or supported format an unknown `name` is a near-miss of (one case change, or one
    edit of a name of three or more characters), else None."""
    for known in _RESEMBLED:
        if name.lower() == known.lower() or (
            min(len(name), len(known)) >= 3 and one_edit(name, known)
        ):
            return known
    return None
