"""The mask buffers of the Program and how a step fills them.

Allocated once at start: pinned host masks and their device mirror `[B, K+1, ceil(V/32)]` int32
(one tensor on the CPU), and one descriptor per compact row (`mask_row`: the flat mask row of the
row's position 0, or -1 = disabled: an unconstrained row never gets an all-ones mask). Bit i of
word w is token 32w+i; bits past the domain size are zero. Ordinary decoding fills position 0 of
every constrained row; several rows are filled in one call per constraint engine.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.grammar.client import MaskFiller, fill_masks
from services.worker.output.positions import LookaheadResult, PositionState
from services.worker.output.session import OutputSession
from shared.errors import InfernixError
from shared.frontends.token_domain import TokenDomain


@dataclass(frozen=True)
class MaskFill:
    """The outcome of one step's fill: descriptors set, per batch row the dead-end error or the
    H2D bytes its mask costs."""

    constrained: bool  # some compact row holds a mask
    dead_ends: dict[int, InfernixError]
    upload_bytes: dict[int, int]


class MaskBuffers:
    """Host/device masks `[B, K+1, ceil(V/32)]` int32 and the per-row descriptors `[B]` int32.

    `max_drafts`: K (0 for ordinary decoding). On CUDA the host side is pinned."""

    def __init__(self, domain: TokenDomain, max_batch: int, max_drafts: int,
                 device: torch.device) -> None:
        cuda = device.type == "cuda"
        self.device = device
        self.stride = max_drafts + 1
        words = domain.mask_words
        self.host = torch.zeros(max_batch, self.stride, words, dtype=torch.int32,
                                pin_memory=cuda)  # [B, K+1, W]
        self.device_masks = torch.zeros_like(self.host, device=device) if cuda else self.host
        self.host_row = torch.full((max_batch,), -1, dtype=torch.int32, pin_memory=cuda)  # [B]
        self._row_bytes = 4 * words if cuda else 0  # nothing is uploaded on the CPU
        self._filler = MaskFiller("auto")  # each engine's batched fill on its own threads

    def fill_ordinary(
        self, sessions: Sequence[OutputSession], positions: Sequence[int]
    ) -> MaskFill:
        """Position-0 masks of one ordinary step: compact row j belongs to sessions[j] (whose
        committed output has positions[j] tokens); unconstrained sessions get the disabled
        descriptor. A constrained row with no legal token is a dead end (its descriptor stays
        disabled: it samples nothing that could be committed)."""
        flat = self.host.view(-1, self.host.shape[-1])  # [B*(K+1), W]
        constrained = [j for j, s in enumerate(sessions) if s.constrained]
        self.host_row[:len(sessions)] = -1
        if len(constrained) > 1:
            results = self._fill_batched([sessions[j] for j in constrained], flat,
                                         [j * self.stride for j in constrained],
                                         [positions[j] for j in constrained])
        else:
            results = [sessions[j].lookahead((), self.host[j], position=positions[j])
                       for j in constrained]
        dead_ends: dict[int, InfernixError] = {}
        upload: dict[int, int] = {}
        for j, result in zip(constrained, results):
            if result.states[0] is PositionState.DEAD_END:
                dead_ends[j] = result.dead_end_error()
                continue
            self.host_row[j] = j * self.stride
            upload[j] = self._row_bytes
        return MaskFill(bool(upload), dead_ends, upload)

    def _fill_batched(self, sessions: Sequence[OutputSession], flat: torch.Tensor,
                      rows: Sequence[int], positions: Sequence[int]) -> list[LookaheadResult]:
        # `lookahead(())` of several constrained sessions at once: one fill call per constraint
        # engine, on the engines' own threads, into flat row rows[k] of session k; the shared
        # wall time is split evenly over the sessions' reports.
        matchers = [s.fill_matcher() for s in sessions]
        start = time.perf_counter()
        failed = fill_masks(matchers, flat, list(rows), self._filler)  # a failure is its row's
        share = (time.perf_counter() - start) / len(sessions)
        return [s.failed(failed[k], flat[r], position=p) if k in failed else
                s.filled(flat[r], seconds=share, position=p)
                for k, (s, r, p) in enumerate(zip(sessions, rows, positions))]

    def upload(self, m: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copy the first m rows to the device (on the current stream); returns (masks,
        mask_row)."""
        self.upload_masks(m)
        return self.device_masks, self.host_row[:m].to(self.device, non_blocking=True)

    def upload_masks(self, m: int) -> None:
        """Copy the first m rows' masks to the device (on the current stream; non-blocking from
        pinned memory), not the descriptors (a decode graph's masked sample stage reads its own)."""
        if self.device_masks is not self.host:
            self.device_masks[:m].copy_(self.host[:m], non_blocking=True)
