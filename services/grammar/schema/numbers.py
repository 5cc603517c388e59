"""EBNF for bounded JSON integers and numbers whose value survives binary64 parsing.

Integers use an exact int64 range over their canonical digits. Non-integral numbers are plain
decimals with 1 to `FRACTION_DIGITS` fraction digits; their range is first tightened to the floats
that satisfy the schema's bounds, then to the decimals strictly inside the rounding midpoints
next to those floats (binary64 rounding is monotone: such a decimal parses to a satisfying float),
then to decimals of that many digits. The range nodes' constructors (`integer_bounds`,
`number_range`) live here too: whether a range holds a value is decided by the same language.
"""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import TYPE_CHECKING

from services.grammar.schema.nodes import (
    INT64_MAX,
    INT64_MIN,
    NEVER,
    IntegerType,
    Node,
    NoValue,
    NumberType,
)

if TYPE_CHECKING:
    from services.grammar.schema.context import Context

FRACTION_DIGITS = 16


def _alt(parts: list[str]) -> str:
    parts = [p for p in parts if p is not None]
    if not parts:
        return ""
    return parts[0] if len(parts) == 1 else "(" + " | ".join(parts) + ")"


def _digit_class(lo: int, hi: int) -> str:
    return f'"{lo}"' if lo == hi else f"[{lo}-{hi}]"


def _same_length(lo: str, hi: str) -> str:
    """Digit strings of len(lo) between lo and hi inclusive (lo <= hi, same length)."""
    n = len(lo)
    if lo == hi:
        return f'"{lo}"'
    if lo == "0" * n and hi == "9" * n:
        return f"[0-9]{{{n}}}" if n > 1 else "[0-9]"
    a, b = int(lo[0]), int(hi[0])
    if n == 1:
        return _digit_class(a, b)
    if lo[1:] == "0" * (n - 1) and hi[1:] == "9" * (n - 1):
        return f"{_digit_class(a, b)} [0-9]{{{n - 1}}}"
    if a == b:
        return f'"{lo[0]}" {_same_length(lo[1:], hi[1:])}'
    parts = [f'"{lo[0]}" {_same_length(lo[1:], "9" * (n - 1))}']
    if a + 1 <= b - 1:
        parts.append(f"{_digit_class(a + 1, b - 1)} [0-9]{{{n - 1}}}")
    parts.append(f'"{hi[0]}" {_same_length("0" * (n - 1), hi[1:])}')
    return _alt(parts)


def natural_range(lo: int, hi: int) -> list[str]:
    """Alternatives for canonical decimal naturals in [lo, hi] (0 <= lo).

    Consecutive lengths whose every value is in range share one alternative,
    `[1-9] [0-9]{m,n}`: few alternatives keep xgrammar's per-token mask work small (an int64
    range written one length at a time cost ~70 us per digit position on the Qwen3.5
    vocabulary)."""
    out = []
    full: list[int] = []  # a run of lengths >= 2 whose every value is in range

    def flush() -> None:
        if full:
            lo_rep, hi_rep = full[0] - 1, full[-1] - 1
            rep = f"{{{lo_rep}}}" if lo_rep == hi_rep else f"{{{lo_rep},{hi_rep}}}"
            out.append(f"[1-9] [0-9]{rep}")
            full.clear()

    for length in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (length - 1) if length > 1 else 0)
        b = min(hi, 10**length - 1)
        if a > b:
            continue
        if length > 1 and a == 10 ** (length - 1) and b == 10**length - 1:
            full.append(length)
            continue
        flush()
        out.append(_same_length(str(a), str(b)))
    flush()
    return out


def integer_range(lo: int, hi: int) -> list[str]:
    """Alternatives for canonical JSON integers in [lo, hi] ("-0" is never generated)."""
    out = []
    if lo < 0:
        out += [f'"-" {x}' for x in natural_range(max(1, -hi), -lo)]
    if hi >= 0:
        out += natural_range(max(0, lo), hi)
    return out


def _fraction(lo: str, hi: str, allow_empty: bool) -> str | None:
    """Digit strings s (length 0..len(lo), non-empty unless allow_empty) with lo <= s0..0 <= hi."""
    n = len(lo)
    if n == 0:
        return '""' if allow_empty else None
    parts: list[str] = []
    if lo == hi == "0" * n:
        return f'"0"{{{0 if allow_empty else 1},{n}}}'
    if allow_empty and lo == "0" * n:
        if hi == "9" * n:
            return f"[0-9]{{0,{n}}}"
        parts.append('""')
    if lo == "0" * n and hi == "9" * n:
        return f"[0-9]{{1,{n}}}"
    a, b = int(lo[0]), int(hi[0])
    if a == b:
        rest = _fraction(lo[1:], hi[1:], True)
        parts.append(f'"{lo[0]}" {rest}')
    else:
        parts.append(f'"{lo[0]}" {_fraction(lo[1:], "9" * (n - 1), True)}')
        if a + 1 <= b - 1:
            parts.append(f"{_digit_class(a + 1, b - 1)} [0-9]{{0,{n - 1}}}")
        parts.append(f'"{hi[0]}" {_fraction("0" * (n - 1), hi[1:], True)}')
    return _alt(parts)


def _decimal_nonneg(a: int, b: int) -> list[str]:
    """Plain decimals "I.F" (F of 1..D digits) with value in [a, b] / 10**D (0 <= a <= b)."""
    scale = 10**FRACTION_DIGITS
    ai, af = divmod(a, scale)
    bi, bf = divmod(b, scale)
    pad = lambda x: str(x).rjust(FRACTION_DIGITS, "0")  # noqa: E731
    nines, zeros = "9" * FRACTION_DIGITS, "0" * FRACTION_DIGITS
    if ai == bi:
        return [f'"{ai}." {_fraction(pad(af), pad(bf), False)}']
    out = [f'"{ai}." {_fraction(pad(af), nines, False)}']
    if ai + 1 <= bi - 1:
        out += [f'{x} "." [0-9]{{1,{FRACTION_DIGITS}}}' for x in natural_range(ai + 1, bi - 1)]
    out.append(f'"{bi}." {_fraction(zeros, pad(bf), False)}')
    return out


def _float_inside(bound: Fraction, exclusive: bool, upper: bool) -> float:
    """The extreme binary64 value satisfying `x <= bound` (upper) or `x >= bound` (lower)."""
    ok = (lambda f: Fraction(f) < bound if exclusive else Fraction(f) <= bound) if upper else \
         (lambda f: Fraction(f) > bound if exclusive else Fraction(f) >= bound)
    inward, outward = (-math.inf, math.inf) if upper else (math.inf, -math.inf)
    f = float(bound)
    while not ok(f):
        f = math.nextafter(f, inward)
    while ok(math.nextafter(f, outward)):
        f = math.nextafter(f, outward)
    return f


def integer_ebnf(node: IntegerType) -> str:
    return _alt(integer_range(node.lo, node.hi))


def number_ebnf(node: NumberType) -> str | None:
    """int64 integers inside the exact bounds, plus plain decimals whose binary64 value is inside;
    None when no such value exists."""
    scale = 10**FRACTION_DIGITS
    lo_i, hi_i = INT64_MIN, INT64_MAX
    lo_d, hi_d = INT64_MIN * scale, (INT64_MAX + 1) * scale - 1
    if node.lo is not None:
        lo_i = max(lo_i, math.floor(node.lo) + 1 if node.lo_exclusive else math.ceil(node.lo))
        f = _float_inside(node.lo, node.lo_exclusive, False)
        # decimals strictly above the midpoint to the next float down round to f or above
        mid = (Fraction(f) + Fraction(math.nextafter(f, -math.inf))) / 2
        lo_d = max(lo_d, math.floor(mid * scale) + 1)
    if node.hi is not None:
        hi_i = min(hi_i, math.ceil(node.hi) - 1 if node.hi_exclusive else math.floor(node.hi))
        f = _float_inside(node.hi, node.hi_exclusive, True)
        mid = (Fraction(f) + Fraction(math.nextafter(f, math.inf))) / 2
        hi_d = min(hi_d, math.ceil(mid * scale) - 1)
    parts = integer_range(lo_i, hi_i) if lo_i <= hi_i else []
    if lo_d <= hi_d:
        if lo_d < 0:
            parts += [f'"-" {x}' for x in _decimal_nonneg(max(0, -hi_d), -lo_d)]
        if hi_d >= 0:
            parts += _decimal_nonneg(max(0, lo_d), hi_d)
    return _alt(parts) if parts else None


# ---- ranges as nodes --------------------------------------------------------------------------


def integer_bounds(num: NumberType, lo: int, hi: int, multiple: int = 1) -> IntegerType | NoValue:
    """Fold a number's exact bounds into an int64 integer range (of multiples of `multiple`)."""
    if num.lo is not None:
        lo = max(lo, math.floor(num.lo) + 1 if num.lo_exclusive else math.ceil(num.lo))
    if num.hi is not None:
        hi = min(hi, math.ceil(num.hi) - 1 if num.hi_exclusive else math.floor(num.hi))
    return integer_type(lo, hi, multiple)


def integer_type(lo: int, hi: int, multiple: int = 1) -> IntegerType | NoValue:
    """Integers in [lo, hi] divisible by `multiple`; NEVER when there is none."""
    if multiple > 1:
        lo = -((-lo) // multiple) * multiple  # the first multiple >= lo
        hi = (hi // multiple) * multiple
    return IntegerType(lo, hi, multiple) if lo <= hi else NEVER


@lru_cache(maxsize=4096)
def _publishable(n: NumberType) -> bool:
    return number_ebnf(n) is not None


def number_range(n: NumberType, ctx: Context | None, pointer: str) -> Node:
    """`n`, NEVER where the range is mathematically empty; a non-empty range without a value the
    number language publishes (`numbers.number_ebnf`: no binary64 value, as in (0, 5e-324), or
    none of its plain decimals) is UnsupportedSchema at `pointer` (the design's rule), or NEVER
    where `ctx` is None (a range a complement derived, which no user wrote: dropping it only
    narrows)."""
    if number_empty(n):
        return NEVER
    if n.lo is not None and n.hi is not None and not _publishable(n):
        if ctx is None:
            return NEVER
        raise ctx.unsupported(pointer, "the numeric range is not empty but holds no number that "
                                       "is generated (int64 integers and plain decimals of at "
                                       "most 16 fraction digits whose binary64 value is inside)")
    return n


def number_empty(n: NumberType) -> bool:
    if n.lo is None or n.hi is None:
        return False
    return n.lo > n.hi or (n.lo == n.hi and (n.lo_exclusive or n.hi_exclusive))
