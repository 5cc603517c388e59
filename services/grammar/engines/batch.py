"""Batched mask fills over matchers of either engine: one call per engine per batch, each engine's
worker threads kept in a `MaskFiller` (the interface the implementations share is engine.py's)."""

from __future__ import annotations

from typing import Any, Sequence

from services.grammar.engines import engine_llguidance, engine_xgrammar
from services.grammar.engines.engine import (
    LLGUIDANCE,
    XGRAMMAR,
    Matcher,
    buffer_address,
    check_mask_buffer,
)
from shared.errors import InternalError


class MaskFiller:
    """Batched mask fills for matchers of any engine (one per Program; not thread-safe).

    `max_threads`: each engine's worker threads for a batch ("auto": the engines' defaults)."""

    def __init__(self, max_threads: int | str = "auto") -> None:
        self.max_threads = max_threads
        self._pools: dict[str, Any] = {}

    def pool(self, engine: str) -> Any:
        if engine not in self._pools:
            module = engine_xgrammar if engine == XGRAMMAR else engine_llguidance
            self._pools[engine] = module.batch_pool(self.max_threads)
        return self._pools[engine]


def fill_masks(matchers: Sequence[Matcher], out: Any, rows: Sequence[int],
               filler: MaskFiller) -> dict[int, Exception]:
    """`matchers[k].fill_mask(out, rows[k])` for every k, in one call per engine. Returns the
    matchers that failed, by index k, with their exceptions (a matcher's failure is its own
    row's: when an engine's batched call raises, its matchers are filled one at a time to find
    which).

    `out`: [N, ceil(V/32)] int32 contiguous CPU buffer; rows must be distinct. Raises
    InternalError on a wrong buffer or row."""
    if len(matchers) != len(rows):
        raise InternalError(f"{len(matchers)} matchers for {len(rows)} rows")
    if len(set(rows)) != len(rows):
        raise InternalError("fill_masks rows must be distinct")
    if matchers:  # a wrong buffer is the caller's bug, not a row's failure
        check_mask_buffer(out, matchers[0].domain)  # type: ignore[attr-defined]
        for r in rows:
            buffer_address(out, r)
    by_engine: dict[str, list[int]] = {}
    for k, m in enumerate(matchers):
        by_engine.setdefault(m.engine, []).append(k)
    failed: dict[int, Exception] = {}
    for engine, ks in by_engine.items():
        if engine == XGRAMMAR:
            batch_fill = engine_xgrammar.batch_fill
        elif engine == LLGUIDANCE:
            batch_fill = engine_llguidance.batch_fill
        else:
            raise InternalError(f"unknown constraint engine {engine!r}")
        try:
            batch_fill(filler.pool(engine), [matchers[k] for k in ks], out, [rows[k] for k in ks])
        except Exception:
            for k in ks:
                try:
                    matchers[k].fill_mask(out, rows[k])
                except Exception as exc:
                    failed[k] = exc
    return failed
