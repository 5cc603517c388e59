"""The Program: the physical side of the worker (lanes, KV cache, mask buffers, graphs, sampling).

Everything here is allocated once at start from the model and the capacity plan:

- the KV cache, one region per resident lane (`KVCache`; plus one scratch lane that absorbs the
  writes of padding rows when decode graphs are used);
- the mask buffers `[B, K+1, ceil(V/32)]` int32, pinned on the host and mirrored on the device
  (the same tensor on CPU), and the per-row descriptors (`mask_row`, -1 = disabled: an
  unconstrained row never gets an all-ones mask);
- on CUDA, one decode graph per batch size (`torch.cuda.CUDAGraph` over static input/output
  buffers, captured lazily for sizes 1, 2, 4, ... up to B; a batch is padded to the next size)
  and a ready event (cuda-python) the host waits on after the results' D2H copies.

`step(batch)` runs one forward for the batch's rows, fills the constrained rows' masks on the CPU
through their OutputSessions (while the forward runs on CUDA), samples with the mask fused before
candidate selection, and returns a `PendingBatch` holding each row's result: tokens, a constraint
dead end, non-finite logits, or no output (an intermediate prefill chunk). Nothing of a step is
committed until `commit(pending, accepted)`; a row left out of `accepted` leaves no trace (its
lane's stray KV writes lie beyond the committed ledger and are overwritten before being read).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

import torch
import xgrammar as xgr

from kernels.sampling_contract import PenaltyHistory, SampleStatus, SamplingParams
from services.worker.models import KVCache
from services.worker.output_session import OutputSession, PositionState
from services.worker.request import Request
from services.worker.runtime import ModelRuntime
from shared.errors import InfernixError, InternalError
from shared.logging import get_logger

log = get_logger(__name__)


class RowOutcome(Enum):
    NO_OUTPUT = "no_output"  # intermediate prefill chunk: nothing sampled
    TOKENS = "tokens"  # sampled tokens to preview and commit
    DEAD_END = "dead_end"  # the constraint allows no token here: the request fails
    NONFINITE = "nonfinite"  # no finite legal logit (or inconsistent device results): internal


@dataclass(frozen=True)
class BatchRow:
    request: Request
    tokens: tuple[int, ...]  # fed this step: a prompt chunk or the newest output token
    start: int  # position of tokens[0] in the lane
    sample: bool  # the row samples its next token after this step


@dataclass(frozen=True)
class StepBatch:
    rows: tuple[BatchRow, ...]

    @property
    def is_decode(self) -> bool:
        return all(len(r.tokens) == 1 and r.sample for r in self.rows)


@dataclass(frozen=True)
class RowResult:
    outcome: RowOutcome
    tokens: tuple[int, ...] = ()
    error: InfernixError | None = None  # set for DEAD_END and NONFINITE
    mask_bytes: int = 0  # mask H2D bytes this row's sampling used


@dataclass(frozen=True)
class PendingBatch:
    batch: StepBatch
    results: tuple[RowResult, ...]


class _ReadyEvent:
    """The event the host waits on after a step's D2H copies: cuda-python when installed, else a
    torch event (same semantics). Imported only on the CUDA path."""

    def __init__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart
        except ImportError:  # pragma: no cover - depends on the GPU host
            self._cudart, self._event = None, torch.cuda.Event()
            log.info("cuda_python_missing", fallback="torch.cuda.Event")
            return
        self._cudart = cudart
        err, self._event = cudart.cudaEventCreateWithFlags(cudart.cudaEventDisableTiming)
        self._check(err, "cudaEventCreateWithFlags")

    def _check(self, err, what: str) -> None:
        if err != self._cudart.cudaError_t.cudaSuccess:
            raise InternalError(f"{what} failed: {err}")

    def record(self, stream: torch.cuda.Stream) -> None:
        if self._cudart is None:
            self._event.record(stream)
            return
        (err,) = self._cudart.cudaEventRecord(self._event, stream.cuda_stream)
        self._check(err, "cudaEventRecord")

    def wait(self) -> None:
        if self._cudart is None:
            self._event.synchronize()
            return
        (err,) = self._cudart.cudaEventSynchronize(self._event)
        self._check(err, "cudaEventSynchronize")

    def close(self) -> None:
        if self._cudart is not None and self._event is not None:
            self._cudart.cudaEventDestroy(self._event)
            self._event = None


class _DecodeGraph:
    """One captured decode forward for a fixed batch size: static tokens/positions/lanes in,
    static last-position logits out. Attention reads the whole lane (kv_len = max_len), so the
    graph does not depend on the context length."""

    def __init__(self, model, cache: KVCache, size: int, scratch_lane: int, pool) -> None:
        device = cache.device
        self.size = size
        self.scratch_lane = scratch_lane
        self.tokens = torch.zeros(size, 1, dtype=torch.int64, device=device)  # [S, 1]
        self.positions = torch.zeros(size, 1, dtype=torch.int64, device=device)  # [S, 1]
        self.lanes = torch.full((size,), scratch_lane, dtype=torch.int64, device=device)  # [S]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):  # warm-up outside capture (allocator, lazy inits)
                model(self.tokens, self.positions, cache, self.lanes, kv_len=cache.max_len)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            out = model(self.tokens, self.positions, cache, self.lanes, kv_len=cache.max_len)
            self.logits = out[:, -1]  # [S, V]

    def run(self, tokens: torch.Tensor, positions: torch.Tensor, lanes: torch.Tensor) -> torch.Tensor:
        """tokens, positions: [n, 1]; lanes: [n] (n <= size); returns logits [n, V] (a view)."""
        n = tokens.shape[0]
        self.tokens[:n].copy_(tokens, non_blocking=True)
        self.positions[:n].copy_(positions, non_blocking=True)
        self.lanes[:n].copy_(lanes, non_blocking=True)
        self.tokens[n:].zero_()
        self.positions[n:].zero_()
        self.lanes[n:].fill_(self.scratch_lane)
        self.graph.replay()
        return self.logits[:n]


def _graph_sizes(max_batch: int) -> tuple[int, ...]:
    sizes, s = [], 1
    while s < max_batch:
        sizes.append(s)
        s *= 2
    return tuple(sizes) + (max_batch,)


class Program:
    """Lanes, buffers, graphs and sampling of one model (see the module docstring).

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
        self.use_graphs = self.cuda and cuda_graphs
        lanes = max_batch + (1 if self.use_graphs else 0)  # + the scratch lane of padding rows
        cap = runtime.config.max_position_embeddings
        if max_len is None:
            self.cache = KVCache.from_budget(runtime.config, lanes, kv_budget_bytes, runtime.dtype,
                                             self.device, max_len=cap)
        else:
            self.cache = KVCache.allocate(runtime.config, lanes, min(max_len, cap), runtime.dtype,
                                          self.device)
        self.max_len = self.cache.max_len
        words = self.domain.mask_words
        pin = self.cuda
        # host_masks, device_masks: [B, K+1, ceil(V/32)] int32 (one tensor on CPU)
        self.host_masks = torch.zeros(max_batch, max_drafts + 1, words, dtype=torch.int32,
                                      pin_memory=pin)
        self.device_masks = (torch.zeros_like(self.host_masks, device=self.device) if self.cuda
                             else self.host_masks)
        self.host_mask_row = torch.full((max_batch,), -1, dtype=torch.int32, pin_memory=pin)  # [B]
        self.host_tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=pin)  # [B]
        self.host_status = torch.zeros(max_batch, dtype=torch.int32, pin_memory=pin)  # [B]
        never = sorted(set(range(len(self.domain.token_bytes), self.domain.size))
                       | set(self.domain.never_ids))
        self._never = torch.tensor(never, dtype=torch.int64, device=self.device) if never else None
        self._free = list(range(max_batch))
        self._graphs: dict[int, _DecodeGraph] = {}
        self._graph_sizes = _graph_sizes(max_batch)
        self._pool = torch.cuda.graph_pool_handle() if self.use_graphs else None
        # Fills the masks of several constrained rows in one call, on xgrammar's own threads.
        self._batcher = xgr.BatchGrammarMatcher(max_threads="auto")
        self._ready = _ReadyEvent() if self.cuda else None
        if self.cuda:
            from kernels.sampling import sample
        else:
            from kernels.sampling_ref import sample_reference as sample
        self._sample = sample

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
    def step(self, batch: StepBatch) -> PendingBatch:
        """Forward, masks, sampling for every row of `batch` (at most B rows, distinct lanes)."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch
        logits = self._forward(batch)  # [n, V] logits after each row's last fed token
        sampled = [i for i, r in enumerate(rows) if r.sample]
        results = [RowResult(RowOutcome.NO_OUTPUT)] * len(rows)
        if not sampled:
            return PendingBatch(batch, tuple(results))
        # The CPU fills masks while the forward runs on CUDA: nothing above waits for the device.
        failures, mask_bytes = self._fill_masks(rows, sampled)
        if len(sampled) < len(rows):
            index = torch.tensor(sampled, dtype=torch.int64, device=self.device)
            z = logits.index_select(0, index)  # [m, V]
        else:
            z = logits  # [m, V]
        self._sample_into_host(z, rows, sampled, failures)
        for j, i in enumerate(sampled):
            if i in failures:
                results[i] = RowResult(RowOutcome.DEAD_END, error=failures[i])
                continue
            status = int(self.host_status[j])
            if status == SampleStatus.OK:
                results[i] = RowResult(RowOutcome.TOKENS, (int(self.host_tokens[j]),),
                                       mask_bytes=mask_bytes.get(i, 0))
            else:
                what = "non-finite logits" if status == SampleStatus.NONFINITE else \
                    "an empty legal set on the device after the CPU mask said Ready"
                results[i] = RowResult(RowOutcome.NONFINITE, error=InternalError(
                    f"sampling found {what} at output position "
                    f"{rows[i].request.num_output_tokens}"))
        return PendingBatch(batch, tuple(results))

    def commit(self, pending: PendingBatch, accepted: Mapping[int, Sequence[int]]) -> None:
        """Commit rows (index in the batch -> accepted tokens, possibly none) to the lane ledger,
        the output ledger and the penalty history; rows not named commit nothing."""
        for i, tokens in accepted.items():
            row = pending.batch.rows[i]
            request = row.request
            request.num_cached = row.start + len(row.tokens)
            request.record_output(list(tokens))
            nbytes = pending.results[i].mask_bytes
            if nbytes:
                request.session.add_upload_bytes(nbytes)

    def close(self) -> None:
        """Destroy graphs before the event and buffers they reference."""
        self._graphs.clear()
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    # ---------------------------------------------------------------- internals

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        rows, dev = batch.rows, self.device
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        if batch.is_decode:
            tokens = torch.tensor([r.tokens for r in rows], dtype=torch.int64)  # [n, 1]
            positions = torch.tensor([[r.start] for r in rows], dtype=torch.int64)  # [n, 1]
            if self.use_graphs:
                graph = self._graph_for(len(rows))
                return graph.run(tokens.to(dev, non_blocking=True),
                                 positions.to(dev, non_blocking=True),
                                 lanes.to(dev, non_blocking=True))
            kv_len = max(r.start for r in rows) + 1
            return self.model(tokens.to(dev), positions.to(dev), self.cache, lanes.to(dev),
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
        last = torch.tensor([[len(r.tokens) - 1] for r in rows], dtype=torch.int64)  # [n, 1]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        kv_len = max(r.start for r in rows) + width
        out = self.model(tokens.to(dev), positions.to(dev), self.cache, lanes.to(dev),
                         kv_len=kv_len, logit_index=last.to(dev))  # [n, 1, V]
        return out[:, 0]

    def _graph_for(self, n: int) -> _DecodeGraph:
        size = next(s for s in self._graph_sizes if s >= n)
        graph = self._graphs.get(size)
        if graph is None:
            graph = _DecodeGraph(self.model, self.cache, size, self.max_batch, self._pool)
            self._graphs[size] = graph
            log.info("decode_graph_captured", batch_size=size)
        return graph

    def _fill_masks(self, rows: Sequence[BatchRow], sampled: list[int]):
        """Lookahead (no drafts) for every constrained sampled row into its host mask row, all
        rows in one multi-threaded xgrammar call when there are several; sets the descriptors.
        Returns (dead-end errors by row, mask bytes by row)."""
        failures: dict[int, InfernixError] = {}
        mask_bytes: dict[int, int] = {}
        row_words = self.host_masks.shape[-1]
        stride = self.max_drafts + 1
        constrained = []  # (batch row i, compact row j)
        for j, i in enumerate(sampled):
            self.host_mask_row[j] = -1
            if rows[i].request.session.constrained:
                constrained.append((i, j))
        if len(constrained) > 1:
            sessions = [rows[i].request.session for i, _ in constrained]
            flat = self.host_masks.view(-1, row_words)  # [B*(K+1), W]
            results = OutputSession.fill_ordinary(sessions, flat, [j * stride for _, j in constrained],
                                                  self._batcher)
        else:
            results = [rows[i].request.session.lookahead((), self.host_masks[j])
                       for i, j in constrained]  # writes [K+1, W] row j
        for (i, j), result in zip(constrained, results):
            if result.states[0] is PositionState.DEAD_END:
                failures[i] = result.dead_end_error()
                continue
            self.host_mask_row[j] = j * stride
            mask_bytes[i] = 4 * row_words if self.cuda else 0
        return failures, mask_bytes

    def _sample_into_host(self, z: torch.Tensor, rows: Sequence[BatchRow], sampled: list[int],
                          failures: Mapping[int, InfernixError]) -> None:
        m = len(sampled)
        requests = [rows[i].request for i in sampled]
        constrained = any(self.host_mask_row[j] >= 0 for j in range(m))
        if z.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            z = z.float()  # the sampling kernels read float32 / half logits
        if self._never is not None:
            z = z.index_fill(1, self._never, float("-inf"))  # never-generable ids
        s = [r.sampling for r in requests]
        params = SamplingParams.from_rows(
            m, temperature=[p.temperature for p in s], top_k=[p.top_k for p in s],
            top_p=[p.top_p for p in s], min_p=[p.min_p for p in s],
            repetition_penalty=[p.repetition_penalty for p in s],
            presence_penalty=[p.presence_penalty for p in s],
            frequency_penalty=[p.frequency_penalty for p in s],
            seed=[r.seed for r in requests], position=[r.num_output_tokens for r in requests],
            device=self.device)
        mask = mask_row = None
        if constrained:
            if self.cuda:
                self.device_masks[:m].copy_(self.host_masks[:m], non_blocking=True)
            mask = self.device_masks
            mask_row = self.host_mask_row[:m].to(self.device, non_blocking=True)
        if all(p.temperature == 0 for p in s):
            width = 1
        elif all(p.top_k > 0 for p in s):
            width = min(max(p.top_k for p in s), self.domain.size)
        else:
            width = None
        result = self._sample(z, params, vocab_size=self.domain.size, mask=mask, mask_row=mask_row,
                              penalties=self._penalties(requests), candidate_width=width)
        self.host_tokens[:m].copy_(result.tokens, non_blocking=self.cuda)
        self.host_status[:m].copy_(result.status, non_blocking=self.cuda)
        if self._ready is not None:
            self._ready.record(torch.cuda.current_stream())
            self._ready.wait()

    def _penalties(self, requests: Sequence[Request]) -> PenaltyHistory | None:
        if not any(r.penalized() for r in requests):
            return None
        histories = [r.penalty_history() if r.penalized() else ([], []) for r in requests]
        width = max(1, max(len(ids) for ids, _ in histories))
        ids = torch.full((len(requests), width), -1, dtype=torch.int32)  # [m, L]
        counts = torch.zeros((len(requests), width), dtype=torch.int32)  # [m, L]
        for j, (h_ids, h_counts) in enumerate(histories):
            ids[j, :len(h_ids)] = torch.tensor(h_ids, dtype=torch.int32)
            counts[j, :len(h_counts)] = torch.tensor(h_counts, dtype=torch.int32)
        return PenaltyHistory(ids.to(self.device), counts.to(self.device))
