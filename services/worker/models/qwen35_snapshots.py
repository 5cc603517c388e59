"""Prefix-cache snapshots of a Qwen3.5 lane's recurrent state (models/qwen35_state.py): slots that
each hold one lane's GDN states and conv windows at a KV block boundary, and the cuts that tell
the next prefill forward where to write them.

The prefix cache (program/blocks.py) keeps a snapshot beside the cached KV blocks, so that a hit
resumes the recurrence at its last cached boundary instead of recomputing the prompt. A forward
takes its cuts (`Snapshots.take`) when it begins; the GDN layers split their recurrence there
(models/gdn.py) and write the rows' state after each cut into the slots.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from services.worker.models.kv_cache import element_size
from services.worker.models.qwen35_config import Qwen35Config


@dataclass(frozen=True)
class Cuts:
    """Where one prefill forward snapshots its rows' recurrent state (`Snapshots.cut_next`):
    after `offsets[i]` tokens of the rows `rows[i]` into the snapshot slots `slots[i]`."""

    offsets: tuple[int, ...]  # distinct, ascending, in 1..T
    rows: tuple[torch.Tensor, ...]  # [n_i] int64 batch rows cut at offsets[i]
    slots: tuple[torch.Tensor, ...]  # [n_i] int64 their snapshot slots
    all_rows: torch.Tensor  # [n] every cut's row, offset and slot (the conv windows, at once)
    all_offsets: torch.Tensor
    all_slots: torch.Tensor

    @classmethod
    def index(cls, cuts: list[tuple[int, int, int]], device: torch.device) -> "Cuts":
        """The device index of (row, offset, slot) triples."""

        def ids(values) -> torch.Tensor:
            return torch.tensor(list(values), dtype=torch.int64).to(device, non_blocking=True)

        offsets = tuple(sorted({t for _, t, _ in cuts}))
        return cls(offsets, tuple(ids(b for b, t, _ in cuts if t == o) for o in offsets),
                   tuple(ids(s for _, t, s in cuts if t == o) for o in offsets),
                   ids(b for b, _, _ in cuts), ids(t for _, t, _ in cuts),
                   ids(s for _, _, s in cuts))


class Snapshots:
    """The snapshot slots of one state (none until `allocate`) and the next forward's cuts.

    `ssm: [G, count, Hv, dk, dv]` and `conv: [G, count, C, K-1]`, shaped and typed like one slot
    of the state's `ssm` / `conv` (`[G, 2 * lanes, ...]`)."""

    def __init__(self) -> None:
        self.ssm: torch.Tensor | None = None
        self.conv: torch.Tensor | None = None
        self._cuts: list[tuple[int, int, int]] = []  # the next forward's (row, offset, slot)

    def allocate(self, count: int, ssm: torch.Tensor, conv: torch.Tensor) -> None:
        """`count` zeroed slots shaped like one row of the state's `ssm` and `conv`."""
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        G = ssm.shape[0]
        self.ssm = torch.zeros(G, count, *ssm.shape[2:], dtype=ssm.dtype, device=ssm.device)
        self.conv = torch.zeros(G, count, *conv.shape[2:], dtype=conv.dtype, device=conv.device)

    @property
    def tensors(self) -> tuple[torch.Tensor, ...]:
        return tuple(t for t in (self.ssm, self.conv) if t is not None)

    @staticmethod
    def bytes_per_slot(config: Qwen35Config, dtype: torch.dtype) -> int:
        """Bytes of one slot (GDN states and conv windows of every GDN layer): half the two-slot
        state of `Qwen35State.bytes_per_lane`."""
        c = config
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        return len(c.gdn_layers) * (hv * dk * dv * 4 + c.conv_dim * (c.linear_conv_kernel_dim - 1)
                                    * element_size(dtype))

    def cut_next(self, cuts: Iterable[tuple[int, int, int]]) -> None:
        """The next forward writes, for each (row b, offset t, slot s), row b's recurrent state
        and conv window after its first t tokens of that forward (1 <= t <= its real tokens)
        into slot s."""
        self._cuts = list(cuts)

    def take(self, device: torch.device) -> Cuts | None:
        """The cuts of the forward that begins now (None: it cuts nothing); later ones cut
        nothing until the next `cut_next`."""
        cuts, self._cuts = self._cuts, []
        return Cuts.index(cuts, device) if cuts else None

    def save(self, ssm: torch.Tensor, conv: torch.Tensor, rows: torch.Tensor,
             slots: torch.Tensor) -> None:
        """Copy rows `rows` ([n] int64) of the state's `ssm` and `conv` into slots `slots` ([n]
        int64, distinct)."""
        self.ssm.index_copy_(1, slots, ssm.index_select(1, rows))
        self.conv.index_copy_(1, slots, conv.index_select(1, rows))

    def restore(self, ssm: torch.Tensor, conv: torch.Tensor, row: torch.Tensor,
                slot: int) -> None:
        """Copy slot `slot` into row `row` ([1] int64) of the state's `ssm` and `conv`."""
        ssm.index_copy_(1, row, self.ssm[:, slot:slot + 1])
        conv.index_copy_(1, row, self.conv[:, slot:slot + 1])
