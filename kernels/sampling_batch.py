"""Per-row sampling parameters that live on the device across decode steps.

Building `SamplingParams` every step costs host work and pageable copies that block the host until
the forward ends. `DeviceSamplingParams` keeps the parameters of the batch's rows in one
device buffer of fixed capacity, written only when the batch's membership (or order) changes, with
one asynchronous copy from pinned memory; between changes the only per-step update is the logical
output position, advanced on the device by each row's committed count (1 for ordinary decoding,
the accepted length for speculative rounds) without a host round trip. `params()` returns
`SamplingParams` views of the buffer: their addresses never change, so a CUDA graph that captured
them stays valid. Host-side summaries (`greedy_only`, `candidate_width`) are kept at `assign` time,
so choosing the sampling route never reads the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from kernels.sampling_contract import SamplingParams, check_value

_FLOATS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
           "frequency_penalty")


@dataclass(frozen=True)
class RowSampling:
    """One row's parameters (host values); defaults as `SamplingParams.from_rows`."""

    temperature: float = 1.0  # >= 0; 0 = greedy
    top_k: int = 0  # >= 0; 0 = all legal tokens
    top_p: float = 1.0  # in (0, 1]
    min_p: float = 0.0  # in [0, 1]
    repetition_penalty: float = 1.0  # > 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    seed: int = 0  # the request's RNG seed, int64

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f.name, 0, getattr(self, f.name))  # ValueError naming the field


class DeviceSamplingParams:
    """Sampling parameters of up to `capacity` batch rows, resident on `device`.

    Layout: one byte buffer holding float32 [6, C] (the float fields), int32 [C] (top_k) and
    int64 [2, C] (seed, position), uploaded in one copy. Raises ValueError for capacity < 1."""

    def __init__(self, capacity: int, device: torch.device | str) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self.device = torch.device(device)
        cap = capacity + capacity % 2  # keeps the int64 section 8-byte aligned
        self.capacity = capacity
        self._sizes = (6 * cap * 4, cap * 4, 2 * cap * 8)
        nbytes = sum(self._sizes)
        cuda = self.device.type == "cuda"
        self._host = torch.zeros(nbytes, dtype=torch.uint8, pin_memory=cuda)
        self._dev = torch.zeros(nbytes, dtype=torch.uint8, device=self.device) if cuda \
            else self._host
        self._host_views = self._views(self._host, cap)
        self._dev_views = self._views(self._dev, cap)
        floats = self._host_views[0]
        floats[_FLOATS.index("top_p")] = floats[_FLOATS.index("repetition_penalty")] = 1.0
        if self._dev is not self._host:  # rows never assigned hold greedy defaults
            self._dev.copy_(self._host)
        self._copied = torch.cuda.Event() if cuda else None
        self.rows = 0
        self.greedy_only = True
        self._max_top_k = 0  # 0 when some sampled row has no top-k

    @staticmethod
    def _views(buf: torch.Tensor, cap: int):
        a, b, _ = 6 * cap * 4, cap * 4, 2 * cap * 8
        floats = buf[:a].view(torch.float32).view(6, cap)  # [6, C]
        top_k = buf[a:a + b].view(torch.int32)  # [C]
        longs = buf[a + b:].view(torch.int64).view(2, cap)  # [2, C]: seed, position
        return floats, top_k, longs

    def assign(self, rows: Sequence[RowSampling], positions: Sequence[int]) -> None:
        """Set the batch's rows in batch order (a membership or order change) and upload them.

        positions[i]: row i's next logical output position (its output tokens so far).
        Raises ValueError for more rows than the capacity, unequal lengths or a bad position."""
        if len(rows) > self.capacity or len(rows) != len(positions):
            raise ValueError(f"rows: expected at most {self.capacity} rows and one position each, "
                             f"got {len(rows)} rows and {len(positions)} positions")
        for i, p in enumerate(positions):
            check_value("position", i, p)
        if self._copied is not None:
            self._copied.synchronize()  # the previous upload has left the pinned buffer
        floats, top_k, longs = self._host_views
        for i, r in enumerate(rows):
            for j, name in enumerate(_FLOATS):
                floats[j, i] = getattr(r, name)
            top_k[i] = r.top_k
            longs[0, i], longs[1, i] = r.seed, positions[i]
        if self._dev is not self._host:
            self._dev.copy_(self._host, non_blocking=True)
            self._copied.record()
        self.rows = len(rows)
        sampled = [r for r in rows if r.temperature > 0]
        self.greedy_only = not sampled
        self._max_top_k = max((r.top_k for r in sampled), default=0) \
            if all(r.top_k > 0 for r in sampled) else 0

    def params(self, rows: int | None = None) -> SamplingParams:
        """`SamplingParams` of the first `rows` rows (default the assigned ones): views of the
        device buffer (no copy, no sync) whose addresses never change. A CUDA graph padded to a
        larger batch may take more rows than assigned: the extra rows hold valid stale values
        (greedy defaults before their first assignment).
        Raises ValueError for rows beyond the capacity."""
        floats, top_k, longs = self._dev_views
        n = self.rows if rows is None else rows
        if not 0 <= n <= self.capacity:
            raise ValueError(f"rows: expected 0..{self.capacity}, got {n}")
        named = {name: floats[j, :n] for j, name in enumerate(_FLOATS)}
        return SamplingParams(top_k=top_k[:n], seed=longs[0, :n], position=longs[1, :n], **named)

    def advance(self, counts: torch.Tensor | int) -> None:
        """Add each row's committed token count to its position, on the device (no host sync).

        counts: an int, or an integer tensor [rows] on the device (e.g. accepted lengths; 0 for a
        row that committed nothing this step)."""
        position = self._dev_views[2][1, :self.rows]
        if isinstance(counts, torch.Tensor):
            if counts.shape != (self.rows,) or not _same_device(counts.device, self.device) \
                    or counts.dtype.is_floating_point:
                raise ValueError(f"counts: expected an integer [{self.rows}] tensor on "
                                 f"{self.device}, got {counts.dtype} {tuple(counts.shape)} on "
                                 f"{counts.device}")
            position.add_(counts.to(torch.int64))
        else:
            position.add_(int(counts))

    def candidate_width(self, vocab_size: int) -> int | None:
        """The `candidate_width` for `kernels.sampling.sample`: 1 for a greedy-only batch (an
        argmax), max(top_k) when every sampled row has a top-k, None (a full sort) otherwise."""
        if self.greedy_only:
            return 1
        return min(self._max_top_k, vocab_size) if self._max_top_k > 0 else None


def _same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` name one device when the current device is 0."""
    if a.type != b.type:
        return False
    if a.type != "cuda":
        return True
    current = torch.cuda.current_device()
    return (current if a.index is None else a.index) == (current if b.index is None else b.index)
