"""The Program: lanes, model state, mask buffers, graphs and sampling of one served model.

Everything is allocated once at start from the model and the capacity plan: the model's per-lane
state (`model.new_state`: a dense model's paged KV cache; plus one scratch lane, whose block table
names only the trash block, for the padding rows of decode graphs), the block manager and prefix
cache over its KV pool (blocks.py: `step` backs each row's new positions with blocks, `commit`
adds full committed blocks to the cache, `attach_prefix` starts an admitted lane from it), the mask buffers (masks.py), the sampler
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
from services.worker.models.kv_cache import BLOCK_SIZE, KVCache, blocks_per_lane
from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, RowResult, StepBatch
from services.worker.program.blocks import BlockManager
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
    fit. `prefix_cache`: the automatic prefix cache (blocks.py; default on).
    `kv_cache_tokens`: KV pool positions, at least (and by default) every lane's full length.
    `state_snapshots`: a hybrid model's recurrent-state snapshot slots (default 2 x max_batch)."""

    def __init__(self, runtime: ModelRuntime, *, max_batch: int, max_len: int | None = None,
                 kv_budget_bytes: int = 256 << 20, max_drafts: int = 0,
                 cuda_graphs: bool = True, prefix_cache: bool = True,
                 kv_cache_tokens: int | None = None, state_snapshots: int | None = None) -> None:
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
        max_len = min(max_len, cap)
        num_blocks = None
        if kv_cache_tokens is not None:  # room beyond the lanes for the prefix cache
            num_blocks = 1 + max(lanes * blocks_per_lane(max_len, BLOCK_SIZE),
                                 blocks_per_lane(kv_cache_tokens, BLOCK_SIZE))
        self.state = self.model.new_state(lanes, max_len, dtype=runtime.dtype,
                                          device=self.device, num_blocks=num_blocks)
        self.max_len = self.state.max_len
        self.prefix_cache = prefix_cache
        kv = _kv(self.state)
        recurrent, snapshots = None, 0
        if _recurrent(self.state) and prefix_cache:
            recurrent, snapshots = self.state, 2 * max_batch if state_snapshots is None else state_snapshots
            self.state.allocate_snapshots(snapshots)
        # A hybrid model's prompt chunks end once at the prompt's last full block (a snapshot).
        self.snapshot_block = kv.block_size if recurrent is not None else None
        self.blocks = BlockManager(kv, max_batch, identity=model_identity(runtime),
                                   enabled=self.prefix_cache, recurrent=recurrent, snapshots=snapshots)
        log.info("kv_pool", blocks=kv.num_blocks, block_size=kv.block_size, max_len=self.max_len,
                 bytes=kv.nbytes, prefix_cache=self.prefix_cache, state_snapshots=snapshots)
        self.masks = MaskBuffers(self.domain, max_batch, max_drafts, self.device)
        self.sampler = Sampler(self.domain, self.device)
        pin = self.cuda
        self.host_tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=pin)  # [B]
        self.host_status = torch.zeros(max_batch, dtype=torch.int32, pin_memory=pin)  # [B]
        self._free = list(range(max_batch))
        self._graphs = self._ready = None
        if use_graphs:
            from services.worker.program.graphs import DecodeGraphs

            self._graphs = DecodeGraphs(self.model, self.state, max_batch, scratch_lane=max_batch)
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
        """Free the lane; its committed full blocks stay in the prefix cache."""
        assert 0 <= lane < self.max_batch and lane not in self._free, lane
        self.blocks.release(lane)
        self._free.append(lane)

    def attach_prefix(self, lane: int, tokens, limit: int) -> int:
        """At admission into an empty lane: how many leading positions of `tokens` (at most
        `limit`, whole KV blocks) the prefix cache already holds; the lane starts with them."""
        return self.blocks.attach(lane, tokens, limit)

    # ---------------------------------------------------------------- one step

    @torch.inference_mode()
    def step(self, batch: StepBatch) -> PendingBatch:
        """Forward, masks, sampling for every row of `batch` (at most B rows, distinct lanes)."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch
        ahead = self.max_drafts + 1 if self.max_drafts else 0  # a proposer's KV past the frontier
        for r in rows:
            self.blocks.reserve(r.request.lane, min(r.end + ahead, self.max_len))
        logits = self._forward(batch)  # [n, V] logits after each row's last fed token
        sampled = [i for i, r in enumerate(rows) if r.sample]
        results = [RowResult(RowOutcome.NO_OUTPUT)] * len(rows)
        if not sampled:
            return PendingBatch(batch, tuple(results))
        requests = [rows[i].request for i in sampled]
        # The CPU fills masks while the forward runs on CUDA: nothing above waits for the device.
        fill = self.masks.fill_ordinary([r.session for r in requests],
                                        [r.num_output_tokens for r in requests])
        z = logits if len(sampled) == len(rows) else logits.index_select(
            0, torch.tensor(sampled, dtype=torch.int64, device=self.device))  # [m, V]
        mask, mask_row = self.masks.upload(len(sampled)) if fill.constrained else (None, None)
        sample = self.sampler.sample(z, requests, mask, mask_row)
        m = len(sampled)
        self.host_tokens[:m].copy_(sample.tokens, non_blocking=self.cuda)
        self.host_status[:m].copy_(sample.status, non_blocking=self.cuda)
        if self._ready is not None:
            self._ready.record(torch.cuda.current_stream())
            self._ready.wait()
        for j, i in enumerate(sampled):
            results[i] = self._row_result(j, rows[i], fill)
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
        for i, k in kept.items():
            row = pending.batch.rows[i]
            self.blocks.commit(row.request.lane, row.start, row.tokens[:k],
                               snapshot=row.start + k <= row.request.num_prompt_tokens)

    def close(self) -> None:
        """Destroy graphs before the event and buffers they reference."""
        if self._graphs is not None:
            self._graphs.clear()
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    # ---------------------------------------------------------------- internals

    def _row_result(self, j: int, row: BatchRow, fill) -> RowResult:
        if j in fill.dead_ends:
            return RowResult(RowOutcome.DEAD_END, error=fill.dead_ends[j])
        status = int(self.host_status[j])
        if status == SampleStatus.OK:
            return RowResult(RowOutcome.TOKENS, (int(self.host_tokens[j]),),
                             mask_bytes=fill.upload_bytes.get(j, 0))
        what = "non-finite logits" if status == SampleStatus.NONFINITE else \
            "an empty legal set on the device after the CPU mask said Ready"
        return RowResult(RowOutcome.NONFINITE, error=InternalError(
            f"sampling found {what} at output position {row.request.num_output_tokens}"))

    def _forward(self, batch: StepBatch) -> torch.Tensor:
        rows, dev = batch.rows, self.device
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        if batch.is_decode:
            tokens = torch.tensor([r.tokens for r in rows], dtype=torch.int64)  # [n, 1]
            positions = torch.tensor([[r.start] for r in rows], dtype=torch.int64)  # [n, 1]
            if self._graphs is not None:
                graph, captured = self._graphs.get(len(rows))
                if captured:
                    log.info("decode_graph_captured", batch_size=graph.size)
                return graph.run(tokens.to(dev, non_blocking=True),
                                 positions.to(dev, non_blocking=True),
                                 lanes.to(dev, non_blocking=True))
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


def model_identity(runtime: ModelRuntime) -> str:
    """What the prefix cache's hash chain starts from: the served name, the weights' source,
    architecture and dtype (an adapter would join here)."""
    source = getattr(runtime.model, "source_path", None)
    return f"{runtime.name}|{source}|{type(runtime.model).__name__}|{runtime.dtype}"


def _kv(state) -> KVCache:
    return state if isinstance(state, KVCache) else state.kv


def _recurrent(state) -> bool:
    return not isinstance(state, KVCache)
