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

A forward never runs at a width the warm-up has not visited, at a lane's end included: where a
row's padded width would leave its lane (positions >= max_len), `plan_widths` splits its tokens
into consecutive forwards of warmed widths that stay inside it (a 497-token last chunk with 500
positions left: 49 tokens at 64, then 448 at 448), committed one after another as a prefill graph
step split at its snapshot cuts is (prefill_graphs.py `run_segments`). A piece's padding may
cover positions the next piece then writes: padded KV lies past the committed frontier and is
overwritten before it is read, and padded tokens leave a hybrid model's state unchanged, so the
split is exact in the same sense; it is the same numerical route as the one forward except that
each piece's width picks its own (a hybrid model's pieces of at most EXACT_WIDTHS tokens take the
per-token recurrence, the chunked one restarts its chunks at each piece; on CUDA a piece of at
most 32 tokens takes the width-invariant GEMMs, models/layers.py).
"""

from __future__ import annotations

from collections.abc import Sequence

EXACT_WIDTHS = 32  # models/gdn.py CHUNK_MIN_TOKENS: wider forwards take the chunked recurrence
PREFILL_STEP = 64  # prefill widths above EXACT_WIDTHS are padded to multiples of this


def prefill_width(width: int) -> int:
    """The padded width of a prefill forward of `width` tokens per row: its own up to
    EXACT_WIDTHS, else the next multiple of PREFILL_STEP (whether it fits the lane is
    `plan_widths`' concern)."""
    return width if width <= EXACT_WIDTHS else -(-width // PREFILL_STEP) * PREFILL_STEP


def prefill_widths(prefill_chunk: int, max_len: int) -> tuple[int, ...]:
    """Every width a prefill forward of at most `prefill_chunk` tokens per row runs at (the set
    the warm-up visits, and the one `plan_widths` picks from): 1 .. EXACT_WIDTHS, then the
    multiples of PREFILL_STEP that `prefill_width` pads to, up to the lane (max_len)."""
    top = min(prefill_chunk, max_len)
    widths = {w for w in range(1, min(top, EXACT_WIDTHS) + 1)}
    widths |= {w for w in (prefill_width(n) for n in range(EXACT_WIDTHS + 1, top + 1))
               if w <= max_len}
    return tuple(sorted(widths))


def plan_widths(start: int, length: int, max_len: int,
                widths: Sequence[int]) -> list[tuple[int, int]] | None:
    """How a row feeds `length` tokens from position `start` through forwards of warmed
    `widths` (ascending) that stay inside its lane: (tokens, width) per consecutive forward,
    tokens <= width and each forward's first position + width <= max_len. One forward at the
    narrowest width that holds them all where it fits; else as few as there can be,
    ceil(length / L) with L the widest width that fits (no forward feeds more): the first feeds
    the remainder at the narrowest width holding it, every later one L tokens at width L, the
    last ending at the row's end. None when no width fits (fewer positions left than the
    narrowest width: a prefill graph near the lane's end)."""
    room = max_len - start
    whole = next((w for w in widths if w >= length), None)
    if whole is not None and whole <= room:
        return [(length, whole)]
    widest = max((w for w in widths if w <= room), default=None)
    if widest is None:
        return None
    pieces = -(-length // widest)
    first = length - (pieces - 1) * widest  # 1 .. widest
    head = next(w for w in widths if w >= first)
    return [(first, head)] + [(widest, widest)] * (pieces - 1)


def context_bounds(max_len: int, width: int, least: int = 256) -> tuple[int, ...]:
    """Context bounds (kv_len) at which a forward of `width` tokens is warmed: the attention
    kernel picks its context splits (and their combine kernel's block) from this bound, in
    power-of-two steps of `least` positions, so one bound per step up to max_len covers them."""
    bounds, b = [], max(width, least)
    while b < max_len:
        bounds.append(b)
        b *= 2
    return tuple(bounds) + (max_len,)
