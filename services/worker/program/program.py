"""The Program: lanes, model state, mask buffers, graphs and sampling of one served model.

Everything is allocated once at start from the model and the capacity plan: the model's per-lane
state (`model.new_state`: a dense model's KV cache; plus one scratch lane that absorbs the writes
of padding rows when decode graphs are used), the mask buffers (masks.py), the sampler
(sampling.py), and on CUDA the decode graphs (graphs.py) and the ready event (events.py).

`step(batch)` runs one forward for the batch's rows, fills the constrained rows' masks on the CPU
while the forward runs on CUDA, samples with the mask fused before candidate selection, and
returns a `PendingBatch` with each row's result: tokens, a constraint dead end, non-finite logits,
or no output (an intermediate prefill chunk). `commit(pending, accepted)` commits device state
only (the model state of the accepted prefixes); ledgers are the Request's, published text the
commit path's. A row left out of `accepted` leaves no trace: its stray KV writes lie beyond the
committed frontier and are overwritten before being read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from kernels.sampling_contract import SampleStatus
from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, RowResult, StepBatch
from services.worker.program.masks import MaskBuffers
from services.worker.program.sampling import Sampler
from services.worker.runtime import ModelRuntime
from shared.errors import InternalError
from shared.logging import get_logger

log = get_logger(__name__)


class Program:
    """Lanes, state, buffers, graphs and sampling of one model (see the module docstring).

    `max_batch`: resident lanes B (>= 1). `max_len`: positions per lane; None (default) takes the
    longest lanes that `kv_budget_bytes` allows, capped at the model's context. `max_drafts`: K,
    the mask buffer's draft dimension (0 for ordinary decoding). `cuda_graphs`: capture decode
    graphs on CUDA (default True; ignored on CPU). Raises ValueError for a capacity that does not
    fit."""

    def __init__(self, runtime: ModelRuntime, *, max_batch: int, max_len: int | None = None,
                 kv_budget_bytes: int = 256 << 20, max_drafts: int = 0,
                 cuda_graphs: bool = True) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.runtime = runtime
        self.model = runtime.model
        self.domain = runtime.domain
        self.device = runtime.device
        self.cuda = self.device.type == "cuda"
        self.max_batch = max_batch
        self.max_drafts = max_drafts
        use_graphs = self.cuda and cuda_graphs
        lanes = max_batch + (1 if use_graphs else 0)  # + the scratch lane of padding rows
        cap = runtime.config.max_position_embeddings
        if max_len is None:
            max_len = self.model.max_len_for_budget(lanes, kv_budget_bytes, runtime.dtype)
        self.state = self.model.new_state(lanes, min(max_len, cap), dtype=runtime.dtype,
                                          device=self.device)
        self.max_len = self.state.max_len
        self.masks = MaskBuffers(self.domain, max_batch, max_drafts, self.device)
        self.sampler = Sampler(self.domain, self.device)
        pin = self.cuda
        self.host_tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=pin)  # [B]
        self.host_status = torch.zeros(max_batch, dtype=torch.int32, pin_memory=pin)  # [B]
        # a decode step's tokens, positions and lanes, uploaded with one non-blocking copy
        self.host_inputs = torch.zeros(max_batch, 3, dtype=torch.int64, pin_memory=pin)  # [B, 3]
        self._free = list(range(max_batch))
        self._graphs = self._ready = self._last_graph = None
        if use_graphs:
            from services.worker.program.graphs import DecodeGraphs

            self._graphs = DecodeGraphs(
                self.model, self.state, max_batch, scratch_lane=max_batch,
                sample_stage=lambda: self.sampler.greedy_in_graph if self.sampler.fast_greedy
                else None)
        if self.cuda:
            from services.worker.program.events import ReadyEvent

            self._ready = ReadyEvent()

    # ---------------------------------------------------------------- lanes

    @property
    def free_lanes(self) -> int:
        return len(self._free)

    def acquire_lane(self) -> int | None:
        """The lowest free lane, or None when all B are resident."""
        if not self._free:
            return None
        self._free.sort()
        return self._free.pop(0)

    def release_lane(self, lane: int) -> None:
        assert 0 <= lane < self.max_batch and lane not in self._free, lane
        self._free.append(lane)

    # ---------------------------------------------------------------- one step

    @torch.inference_mode()
    def step(self, batch: StepBatch, on_launch=None) -> PendingBatch:
        """Forward, masks, sampling for every row of `batch` (at most B rows, distinct lanes).
        `on_launch()`, when given, runs once the forward is launched (on CUDA the device is busy
        then: host work placed there overlaps it)."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch
        logits = self._forward(batch)  # [n, V] logits after each row's last fed token
        if on_launch is not None:
            on_launch()
        sampled = [i for i, r in enumerate(rows) if r.sample]
        results = [RowResult(RowOutcome.NO_OUTPUT)] * len(rows)
        if not sampled:
            return PendingBatch(batch, tuple(results))
        requests = [rows[i].request for i in sampled]
        # The CPU fills masks while the forward runs on CUDA: nothing above waits for the device.
        fill = self.masks.fill_ordinary([r.session for r in requests],
                                        [r.num_output_tokens for r in requests])
        m = len(sampled)
        graph = self._last_graph
        if graph is not None and graph.sampled is not None and not fill.constrained \
                and self.sampler.graph_ready(requests):
            tokens, status = (t[:m] for t in graph.sampled)  # sampled inside the decode graph
        else:
            z = logits if len(sampled) == len(rows) else logits.index_select(
                0, torch.tensor(sampled, dtype=torch.int64, device=self.device))  # [m, V]
            mask, mask_row = self.masks.upload(m) if fill.constrained else (None, None)
            sample = self.sampler.sample(z, requests, mask, mask_row)
            tokens, status = sample.tokens, sample.status
        self.host_tokens[:m].copy_(tokens, non_blocking=self.cuda)
        self.host_status[:m].copy_(status, non_blocking=self.cuda)
        if self._ready is not None:
            self._ready.record(torch.cuda.current_stream())
            self._ready.wait()
        host_tokens, host_status = self.host_tokens[:m].tolist(), self.host_status[:m].tolist()
        for j, i in enumerate(sampled):
            results[i] = self._row_result(j, rows[i], fill, host_tokens[j], host_status[j])
        return PendingBatch(batch, tuple(results))

    def commit(self, pending: PendingBatch, kept: Mapping[int, int]) -> None:
        """Commit the device state of the rows named: batch index -> how many of the tokens the
        row fed this step the model state keeps (all of them in ordinary decoding; the anchor
        and the accepted drafts when verifying). Rows not named commit nothing."""
        if not kept:
            return
        lanes = torch.tensor([pending.batch.rows[i].request.lane for i in kept], dtype=torch.int64,
                             device=self.device)
        counts = torch.tensor(list(kept.values()), dtype=torch.int64, device=self.device)
        self.state.commit(lanes, counts)

    def close(self) -> None:
        """Destroy graphs before the event and buffers they reference."""
        if self._graphs is not None:
            self._graphs.clear()
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    # ---------------------------------------------------------------- internals

    def _row_result(self, j: int, row: BatchRow, fill, token: int, status: int) -> RowResult:
        if j in fill.dead_ends:
            return RowResult(RowOutcome.DEAD_END, error=fill.dead_ends[j])
        if status == SampleStatus.OK:
            return RowResult(RowOutcome.TOKENS, (token,), mask_bytes=fill.upload_bytes.get(j, 0))
        what = "non-finite logits" if status == SampleStatus.NONFINITE else \
            "an empty legal set on the device after the CPU mask said Ready"
        return RowResult(RowOutcome.NONFINITE, error=InternalError(
            f"sampling found {what} at output position {row.request.num_output_tokens}"))

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        self._last_graph = None  # the decode graph this step replays, if any
        rows, dev = batch.rows, self.device
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        if batch.is_decode:
            tokens = torch.tensor([r.tokens for r in rows], dtype=torch.int64)  # [n, 1]
            positions = torch.tensor([[r.start] for r in rows], dtype=torch.int64)  # [n, 1]
            if self._graphs is not None:
                graph, captured = self._graphs.get(len(rows))
                if captured:
                    log.info("decode_graph_captured", batch_size=graph.size)
                n = len(rows)
                staged = self.host_inputs[:n]  # contiguous and pinned: the copy does not block
                staged[:, 0:1].copy_(tokens)
                staged[:, 1:2].copy_(positions)
                staged[:, 2].copy_(lanes)
                inputs = staged.to(dev, non_blocking=True)  # [n, 3]
                self._last_graph = graph
                return graph.run(inputs[:, 0:1], inputs[:, 1:2], inputs[:, 2])
            kv_len = max(r.start for r in rows) + 1
            return self.model(tokens.to(dev), positions.to(dev), self.state, lanes.to(dev),
                              kv_len=kv_len)[:, -1]
        width = max(len(r.tokens) for r in rows)
        if any(r.start + width > self.max_len for r in rows):  # padding would leave the lane
            return torch.cat([self._prefill((r,), len(r.tokens)) for r in rows])
        return self._prefill(rows, width)

    def _prefill(self, rows: Sequence[BatchRow], width: int) -> torch.Tensor:
        # Rows padded on the right to `width` at the following positions (all < max_len).
        dev = self.device
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        positions = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        for i, r in enumerate(rows):
            tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
            positions[i] = torch.arange(r.start, r.start + width)
        fed = torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64)  # [n]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        kv_len = max(r.start for r in rows) + width
        out = self.model(tokens.to(dev), positions.to(dev), self.state, lanes.to(dev),
                         kv_len=kv_len, logit_index=(fed - 1)[:, None].to(dev),
                         num_tokens=fed.to(dev))  # [n, 1, V]
        return out[:, 0]
