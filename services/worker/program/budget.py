"""How long the Program's lanes are when their length comes from the KV budget, and the model
state allocated for them (`new_state`).

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

from services.worker.models.kv_cache import BLOCK_SIZE, blocks_per_lane


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


def new_state(runtime, lanes: int, max_len: int | None, *, kv_budget_bytes: int,
              max_drafts: int, snapshots: int, kv_cache_tokens: int | None,
              context_bytes_per_position: int):
    """The model state of `lanes` lanes (`model.new_state`): `max_len` positions each, or with
    None the longest that `kv_budget_bytes` pays for beside a hybrid model's `snapshots`
    prefix-cache snapshot slots and a draft's context cache, capped at the model's context;
    verifying up to `max_drafts` + 1 tokens a row when drafting; a KV pool of at least
    `kv_cache_tokens` positions (room beyond the lanes for the prefix cache) when given."""
    model, dtype = runtime.model, runtime.dtype
    extra = {"verify_width": max_drafts + 1} if max_drafts else {}
    if max_len is None:
        snapshot_bytes = getattr(model, "snapshot_bytes", None)
        paid = snapshots * snapshot_bytes(dtype) if snapshot_bytes is not None else 0
        max_len = lane_length(model, lanes, kv_budget_bytes, dtype, paid=paid,
                              per_position=context_bytes_per_position, **extra)
    max_len = min(max_len, runtime.config.max_position_embeddings)
    num_blocks = None
    if kv_cache_tokens is not None:
        num_blocks = 1 + max(lanes * blocks_per_lane(max_len, BLOCK_SIZE),
                             blocks_per_lane(kv_cache_tokens, BLOCK_SIZE))
    return model.new_state(lanes, max_len, dtype=dtype, device=runtime.device,
                           num_blocks=num_blocks, **extra)
