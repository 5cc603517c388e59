"""Small Triton helpers shared by the kernels.

`to_dtype(x, dtype)` converts float32 to a storage dtype with round-to-nearest-even everywhere:
compiled kernels do that natively, but Triton's CPU interpreter (checked with triton 3.9) truncates
float32 -> bfloat16, so under TRITON_INTERPRET=1 the value is rounded first with integer arithmetic
(exact, ties to even) and the conversion only drops zero bits. Compiled code never takes that
branch.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
_INTERPRETED = tl.constexpr(INTERPRETED)


@triton.jit
def to_dtype(x, dtype: tl.constexpr):
    if _INTERPRETED:
        if dtype == tl.bfloat16:
            bits = x.to(tl.float32).to(tl.int32, bitcast=True)
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # keep the high 16 bits
            x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)
