"""`multipleOf`: integers divisible by an integer k (a regular language, also within ranges), and
for a fractional k the integers both readings take (see `_fractional_multiple`)."""

from __future__ import annotations

from fractions import Fraction
from typing import TYPE_CHECKING, Any

from services.grammar.schema.nodes import FULL_TYPES, IntegerType, Node, make_union

if TYPE_CHECKING:
    from services.grammar.schema.reader import Reader


def _others(*kinds: str) -> list[Node]:
    return [n for k, n in FULL_TYPES.items() if k not in kinds]


def multiple_of(r: "Reader", k: Any, at: str) -> Node:
    if not isinstance(k, (int, float)) or isinstance(k, bool) or k <= 0:
        raise r.ctx.invalid(at, "multipleOf must be a number greater than 0")
    from services.grammar.schema.typed import rounded

    rounded(r, k, at)
    from services.grammar.schema.arrays import MAX_MODULUS

    if isinstance(k, float) and not k.is_integer():
        return _fractional_multiple(r, k, at, MAX_MODULUS)
    k = int(k)

    if k > MAX_MODULUS:
        raise r.ctx.unsupported(at, f"multipleOf {k} is above {MAX_MODULUS}")
    return make_union(_others("number") + [IntegerType(multiple=k)])


def _fractional_multiple(r: "Reader", k: float, at: str, max_modulus: int) -> Node:
    """`multipleOf k` for a fractional k, as the integers both readings take: the decimal one
    (n / k an integer, k as written: n a multiple of k's numerator p in lowest terms) and the
    validators' (`jsonschema` divides binary64 values, instance / k, and asks for an integral
    quotient). For such n, n / k is an integer m; with k's binary64 value k(1 + e), the computed
    quotient is m / (1 + e) rounded, which is m itself when |1 - 1 / (1 + e)| <= 2**-54 and
    |m|, |n| < 2**53 (the error stays below half an ulp of m): so only such k are accepted and
    the integers are bounded there. The non-integral multiples (0.07 for 0.01, which the
    validators refuse; 2.5 for 2.5, which both take) are not generated: narrower, never looser,
    and refused under a complement (an integer set has no exact complement here)."""
    written = Fraction(repr(k))  # the source's digits (rounded() refused any other)
    error = 1 - written / Fraction(k)
    p = written.numerator
    if abs(error) > Fraction(1, 2**54) or p > max_modulus:
        raise r.ctx.unsupported(at, f"multipleOf {k}: a fractional multiple is supported where "
                                    "binary64 division keeps the integral quotients exact; not "
                                    "here (validators divide binary64 values: no language agrees "
                                    "with both readings)")
    from services.grammar.schema.numbers import integer_type

    bound = min(2**53 - 1, int((2**53 - 1) * written))  # |n| < 2**53 and |n / k| < 2**53
    return make_union(_others("number") + [integer_type(-bound, bound, p)])
