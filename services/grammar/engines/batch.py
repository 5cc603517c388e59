"""Batched mask fills over matchers of either engine: one call per engine per batch, each engine's
worker threads kept in a `MaskFiller` (the interface the implementations share is engine.py's)."""

from __future__ import annotations

from typing import Any, Sequence

from services.grammar.engines import engine_llguidance, engine_xgrammar
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR, Matcher
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
               filler: MaskFiller) -> None:
    """`matchers[k].fill_mask(out, rows[k])` for every k, in one call per engine.

    `out`: [N, ceil(V/32)] int32 contiguous CPU buffer; rows must be distinct. Raises
    InternalError on a wrong buffer or row."""
    if len(matchers) != len(rows):
        raise InternalError(f"{len(matchers)} matchers for {len(rows)} rows")
    if len(set(rows)) != len(rows):
        raise InternalError("fill_masks rows must be distinct")
    by_engine: dict[str, tuple[list[Matcher], list[int]]] = {}
    for m, r in zip(matchers, rows):
        group = by_engine.setdefault(m.engine, ([], []))
        group[0].append(m)
        group[1].append(r)
    for engine, (ms, rs) in by_engine.items():
        if engine == XGRAMMAR:
            batch_fill = engine_xgrammar.batch_fill
        elif engine == LLGUIDANCE:
            batch_fill = engine_llguidance.batch_fill
        else:
            raise InternalError(f"unknown constraint engine {engine!r}")
        batch_fill(filler.pool(engine), ms, out, rs)
