"""How long the Program's lanes are when their length comes from the KV budget.

One budget pays for everything allocated per lane at start: the model's state (the dense KV pool,
or a hybrid model's KV pool, recurrent state, conv windows and what verifying up to
`verify_width` tokens needs: `model.max_len_for_budget`), a hybrid model's prefix-cache snapshot
slots (`paid`, fixed bytes), and a speculative draft model's per-lane context cache beside the
state (`per_position` bytes per lane position: a DFlash draft's context K/V, [layers, 2, lanes,
max_len, Hkv, D]; `DFlashDraft.cache_bytes_per_position`). The lanes are the longest whose state
and context cache together fit.
"""

from __future__ import annotations

import torch


def lane_length(model, lanes: int, budget_bytes: int, dtype: torch.dtype, *, paid: int = 0,
                per_position: int = 0, verify_width: int = 0) -> int:
    """The most positions per lane (capped at the model's context) whose state, `paid` bytes and
    `lanes` x positions x `per_position` bytes of context cache fit `budget_bytes`. Raises
    ValueError when not even one position per lane fits."""
    free = max(budget_bytes - paid, 0)

    def fits(n: int) -> int:  # the model's longest lanes once n positions of context are paid
        rest = free - lanes * n * per_position
        if rest < 0:
            return 0
        try:
            return model.max_len_for_budget(lanes, rest, dtype, verify_width=verify_width)
        except ValueError:
            return 0

    longest = model.max_len_for_budget(lanes, free, dtype, verify_width=verify_width)
    if not per_position:
        return longest
    lo, hi = 0, longest  # fits(n) >= n holds at lo, not above hi; it only falls as n grows
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) >= mid else (lo, mid - 1)
    if lo == 0:
        raise ValueError(f"a state budget of {budget_bytes} bytes holds no position for {lanes} "
                         f"lanes beside the draft's context cache ({per_position} bytes per lane "
                         f"position)")
    return lo
