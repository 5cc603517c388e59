"""The finite set of forward shapes a Program runs, so every kernel shape can be compiled before
the first request (warmup.py) instead of on the request path.

Triton specializes a kernel on its integer arguments (value 1, divisibility by 16) and on the
block sizes derived from them, and fla-core's chunked gated delta rule compiles per such variant:
a prefill chunk of every new length could compile anew. So a prefill forward wider than
`EXACT_WIDTHS` is padded on the right to the next multiple of `PREFILL_STEP` (fla's own chunk
size, which it pads to anyway). Right padding is exact: padded tokens sit after every real one
(causal attention never lets a real query see them), write KV only past the lane's committed
frontier or into the trash block, and carry g = beta = 0 through a hybrid model's recurrence,
which leaves the state unchanged (models/gdn.py); the logits read are each row's last real token.
Forwards up to `EXACT_WIDTHS` tokens keep their width: a hybrid model runs them through the
per-token recurrence (a different numerical route from the chunked one), and they are few
enough for the warm-up to visit every one.
"""

from __future__ import annotations

EXACT_WIDTHS = 32  # models/gdn.py CHUNK_MIN_TOKENS: wider forwards take the chunked recurrence
PREFILL_STEP = 64  # prefill widths above EXACT_WIDTHS are padded to multiples of this


def prefill_width(width: int, start: int, max_len: int) -> int:
    """The padded width of a prefill forward of `width` tokens whose latest row starts at
    `start`: the next multiple of PREFILL_STEP above EXACT_WIDTHS, where the padding stays inside
    the lane (positions < max_len); else `width` itself."""
    if width <= EXACT_WIDTHS:
        return width
    padded = -(-width // PREFILL_STEP) * PREFILL_STEP
    return padded if start + padded <= max_len else width


def prefill_widths(prefill_chunk: int, max_len: int) -> tuple[int, ...]:
    """Every width a prefill forward of at most `prefill_chunk` tokens per row is run at (from the
    start of a lane): 1 .. EXACT_WIDTHS, then the multiples of PREFILL_STEP that
    `prefill_width` pads to."""
    top = min(prefill_chunk, max_len)
    widths = {w for w in range(1, min(top, EXACT_WIDTHS) + 1)}
    widths |= {prefill_width(w, 0, max_len) for w in range(EXACT_WIDTHS + 1, top + 1)}
    return tuple(sorted(widths))


def context_bounds(max_len: int, width: int, least: int = 256) -> tuple[int, ...]:
    """Context bounds (kv_len) at which a forward of `width` tokens is warmed: the attention
    kernel picks its context splits (and their combine kernel's block) from this bound, in
    power-of-two steps of `least` positions, so one bound per step up to max_len covers them."""
    bounds, b = [], max(width, least)
    while b < max_len:
        bounds.append(b)
        b *= 2
    return tuple(bounds) + (max_len,)
