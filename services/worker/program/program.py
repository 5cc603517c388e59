"""The Program: lanes, model state, mask buffers, graphs and sampling of one served model.

Everything is allocated once at start from the model and the capacity plan: the model's per-lane
state (`model.new_state`: a dense model's paged KV cache; plus one scratch lane, whose block table
names only the trash block, for the padding rows of decode graphs), the block manager and prefix
cache over its KV pool (blocks.py: `step` backs each row's new positions with blocks, `commit`
adds full committed blocks to the cache, `attach_prefix` starts an admitted lane from it), the mask buffers (masks.py), the sampler
(sampling.py), and on CUDA the decode graphs (graphs.py) and the ready event (events.py).

`step(batch)` runs one forward for the batch's rows (a verification round when rows carry drafts:
verify.py), fills the constrained rows' masks on the CPU
while the forward runs on CUDA, samples with the mask fused before candidate selection, and
returns a `PendingBatch` with each row's result: tokens, a constraint dead end, non-finite logits,
or no output (an intermediate prefill chunk). `commit(pending, accepted)` commits device state
only (the model state of the accepted prefixes); ledgers are the Request's, published text the
commit path's. A row left out of `accepted` leaves no trace: its stray KV writes lie beyond the
committed frontier and are overwritten before being read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from kernels.sampling_contract import SampleStatus
from services.worker.models.kv_cache import BLOCK_SIZE, KVCache, blocks_per_lane
from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, RowResult, StepBatch
from services.worker.program.blocks import BlockManager
from services.worker.program.masks import MaskBuffers
from services.worker.program.sampling import Sampler
from services.worker.program.verify import Verifier
from services.worker.runtime import ModelRuntime
from shared.errors import InternalError
from shared.logging import get_logger

log = get_logger(__name__)


@dataclass(frozen=True, eq=False)
class Launched:
    """An ordinary step whose forward is launched (`Program.launch`), not yet sampled."""

    batch: StepBatch
    logits: torch.Tensor  # [n, V] after each row's last fed token (a graph's static output)
    graph: object | None  # the decode graph it replayed (its in-graph sample stage), if any


class Program:
    """Lanes, state, buffers, graphs and sampling of one model (see the module docstring).

    `max_batch`: resident lanes B (>= 1). `max_len`: positions per lane; None (default) takes the
    longest lanes that `kv_budget_bytes` allows, capped at the model's context. `max_drafts`: K,
    the mask buffer's draft dimension (0 for ordinary decoding). `cuda_graphs`: capture decode
    graphs on CUDA (default True; ignored on CPU). Raises ValueError for a capacity that does not
    fit. `prefix_cache`: the automatic prefix cache (blocks.py; default on).
    `kv_cache_tokens`: KV pool positions, at least (and by default) every lane's full length.
    `state_snapshots`: a hybrid model's recurrent-state snapshot slots (default 2 x max_batch, at
    least 8), paid from `kv_budget_bytes` when max_len comes from it."""

    def __init__(self, runtime: ModelRuntime, *, max_batch: int, max_len: int | None = None,
                 kv_budget_bytes: int = 256 << 20, max_drafts: int = 0, mtp: bool = False,
                 draft=None, cuda_graphs: bool = True, prefix_cache: bool = True,
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
        # MTP reads each step's final hidden states: its decode and verify graphs keep them.
        # DFlash (greedy one-hot drafts) captures its Forward phase instead; DFlash2 is eager.
        use_graphs = self.cuda and cuda_graphs and (draft is None or not draft.config.dflash2)
        lanes = max_batch + (1 if use_graphs else 0)  # + the scratch lane of padding rows
        cap = runtime.config.max_position_embeddings
        # A hybrid model's prefix-cache snapshots are paid from the same budget as the lanes.
        snapshot_bytes = getattr(self.model, "snapshot_bytes", None)
        snapshots = max(8, 2 * max_batch) if state_snapshots is None else state_snapshots
        if max_len is None:
            paid = snapshots * snapshot_bytes(runtime.dtype) \
                if snapshot_bytes is not None and prefix_cache else 0
            max_len = self.model.max_len_for_budget(lanes, max(kv_budget_bytes - paid, 0),
                                                    runtime.dtype)
        max_len = min(max_len, cap)
        num_blocks = None
        if kv_cache_tokens is not None:  # room beyond the lanes for the prefix cache
            num_blocks = 1 + max(lanes * blocks_per_lane(max_len, BLOCK_SIZE),
                                 blocks_per_lane(kv_cache_tokens, BLOCK_SIZE))
        extra = {"verify_width": max_drafts + 1} if max_drafts else {}
        self.state = self.model.new_state(lanes, max_len, dtype=runtime.dtype,
                                          device=self.device, num_blocks=num_blocks, **extra)
        self.max_len = self.state.max_len
        self.prefix_cache = prefix_cache
        kv = _kv(self.state)
        recurrent = None
        if _recurrent(self.state) and prefix_cache:
            recurrent = self.state
            self.state.allocate_snapshots(snapshots)
        else:
            snapshots = 0
        self.blocks = BlockManager(kv, max_batch, identity=model_identity(runtime),
                                   enabled=self.prefix_cache, recurrent=recurrent,
                                   snapshots=snapshots, special_ids=self.domain.special_ids)
        log.info("kv_pool", blocks=kv.num_blocks, block_size=kv.block_size, max_len=self.max_len,
                 bytes=kv.nbytes, prefix_cache=self.prefix_cache, state_snapshots=snapshots,
                 snapshot_bytes=snapshots * snapshot_bytes(runtime.dtype)
                 if snapshots and snapshot_bytes is not None else 0)
        self.masks = MaskBuffers(self.domain, max_batch, max_drafts, self.device)
        self.sampler = Sampler(self.domain, self.device)
        self.verifier = Verifier(self.domain, self.device, self.masks, self.sampler,
                                 max_drafts) if max_drafts > 0 else None
        # A model-based proposer (MTP, DFlash): aligned with and drafting after every step.
        self.proposer = None
        self.draft_wait_seconds = 0.0  # host time waiting for a model proposer's drafts
        self._tap: tuple[int, ...] = ()  # target layers whose outputs DFlash reads
        self._hidden: list[torch.Tensor] = []  # [n_i, T_i, H'] what the proposer reads
        if mtp:
            from services.worker.spec.mtp import MtpProposer

            self.proposer = MtpProposer(self.model, self.state, max(max_drafts, 1),
                                        self.domain.size)
        elif draft is not None:
            from services.worker.spec.dflash import DFlashProposer

            self.proposer = DFlashProposer(self.model, draft, lanes, self.max_len,
                                           max(max_drafts, 1), self.domain.size,
                                           dtype=runtime.dtype, device=self.device)
            self._tap = self.proposer.tap
            # The round's draft ids come back here (pinned) before the host waits on the event.
            self.host_drafts = torch.zeros(max_batch, self.proposer.k, dtype=torch.int64,
                                           pin_memory=self.cuda)  # [B, K]
        pin = self.cuda
        self.host_tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=pin)  # [B]
        self.host_status = torch.zeros(max_batch, dtype=torch.int32, pin_memory=pin)  # [B]
        # a decode step's tokens, positions and lanes, uploaded with one non-blocking copy
        self.host_inputs = torch.zeros(max_batch, 3, dtype=torch.int64, pin_memory=pin)  # [B, 3]
        # a constrained decode step's mask descriptor per decode-graph row (-1: unconstrained)
        self.host_graph_row = torch.full((max_batch,), -1, dtype=torch.int32, pin_memory=pin)  # [B]
        self._free = list(range(max_batch))
        self._ahead: StepBatch | None = None  # the step whose device state commit_ahead committed
        self._graphs = self._verify_graphs = self._ready = self._dflash_graphs = None
        self._last_graph = None  # the decode graph the current step replays, if any
        if self.cuda:
            from services.worker.program.events import ReadyEvent

            self._ready = ReadyEvent()
        if use_graphs and draft is not None:
            from services.worker.program.graphs import DFlashForwardGraphs

            self._dflash_graphs = DFlashForwardGraphs(self.model, self.state, self.proposer,
                                                      max_batch, max_batch, self.host_drafts,
                                                      self._ready)
        elif use_graphs:
            from services.worker.program.graphs import DecodeGraphs

            self._graphs = DecodeGraphs(
                self.model, self.state, max_batch, scratch_lane=max_batch, keep_hidden=mtp,
                sample_stage=lambda: self.sampler.greedy_in_graph if self.sampler.fast_greedy
                else None,
                masked_stage=lambda: (self.sampler.masked_greedy_in_graph, self.masks.device_masks)
                if self.sampler.fast_greedy and self.sampler.graph_masked else None)
            if max_drafts > 0:  # the host-launched route's verify forward, K+1 tokens a row
                self._verify_graphs = DecodeGraphs(self.model, self.state, max_batch,
                                                   scratch_lane=max_batch, width=max_drafts + 1,
                                                   keep_hidden=mtp)

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
    def step(self, batch: StepBatch, on_launch=None) -> PendingBatch:
        """Forward, masks, sampling for every row of `batch` (at most B rows, distinct lanes).
        `on_launch()`, when given, runs once the forward is launched (on CUDA the device is busy
        then: host work placed there overlaps it)."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch
        if any(r.draft_limit for r in rows):
            self._reserve(rows)
            return self._after(self._device_verify(batch))
        if batch.has_drafts:
            self._reserve(rows)
            return self._after(self._verify(batch))
        launched = self.launch(batch)
        if on_launch is not None:
            on_launch()
        return self.finish(launched)

    @property
    def chainable(self) -> bool:
        """Whether the Engine may launch decode step n+1 before committing step n (its pipeline,
        engine.py): without drafts (a proposer aligns with every committed step). A dense model's
        uncommitted KV writes lie past the frontier; a hybrid model's recurrent state is read from
        the committed slot, so step n's device state is committed ahead (`commit_ahead`)."""
        return self.proposer is None and self.max_drafts == 0

    @property
    def recurrent(self) -> bool:
        """Whether the model state holds recurrent state (a hybrid model) beside its KV."""
        return _recurrent(self.state)

    def commit_ahead(self, pending: PendingBatch) -> None:
        """Commit the device state of an ordinary decode step's rows (one fed token each) before
        the commit path previews them: the Engine's pipeline launches the next step first, and a
        hybrid model's next forward must read the state after this one. `commit(pending, ...)`
        then skips the device part for these rows. A dense KV cache needs nothing. A row that
        the commit path then does not commit (an aborted round) must be replayed (engine.py)."""
        if not _recurrent(self.state) or not pending.batch.rows:
            return
        rows = pending.batch.rows
        assert pending.batch.is_decode, "commit_ahead takes ordinary decode steps only"
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)
        ones = torch.ones(len(rows), dtype=torch.int64)
        self.state.commit(lanes.to(self.device, non_blocking=True),
                          ones.to(self.device, non_blocking=True))
        self._ahead = pending.batch

    @torch.inference_mode()
    def launch(self, batch: StepBatch) -> "Launched":
        """The forward of an ordinary step (no drafts), launched: on CUDA the device runs it
        while the host goes on; `finish` samples it."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch and not batch.has_drafts
        self._reserve(rows)
        logits = self._forward(batch)  # [n, V] logits after each row's last fed token
        return Launched(batch, logits, self._last_graph)

    @torch.inference_mode()
    def finish(self, launched: "Launched", keep: Sequence[int] | None = None) -> PendingBatch:
        """Masks and sampling of a launched step. `keep`: the batch indices still wanted (default
        all): the others are left out of the PendingBatch (nothing of them is sampled or can be
        committed; their forward leaves no trace past the committed frontier)."""
        rows = launched.batch.rows
        index = list(range(len(rows))) if keep is None else list(keep)
        sampled = [i for i in index if rows[i].sample]
        results = {i: RowResult(RowOutcome.NO_OUTPUT) for i in index}
        if not sampled:
            return self._after(self._pending(rows, index, results))
        requests = [rows[i].request for i in sampled]
        # The CPU fills masks while the forward runs on CUDA: nothing above waits for the device.
        fill = self.masks.fill_ordinary([r.session for r in requests],
                                        [r.num_output_tokens for r in requests])
        m = len(sampled)
        whole = sampled == list(range(m))  # the leading rows: views, no gather
        pick = None if whole else torch.tensor(sampled, dtype=torch.int64).to(self.device, non_blocking=True)
        graph = launched.graph
        ready = graph is not None and self.sampler.graph_ready(requests)
        if ready and graph.sampled is not None and not fill.constrained:
            # sampled inside the decode graph
            tokens, status = (t[:m] if whole else t.index_select(0, pick) for t in graph.sampled)
        elif ready and graph.masked_graph is not None and fill.constrained:
            # the decode graph's masked sample stage: masks up, one descriptor per graph row
            self.masks.upload_masks(m)
            rows_desc = self.host_graph_row[:graph.size]
            rows_desc.fill_(-1)
            rows_desc[torch.tensor(sampled)] = self.masks.host_row[:m]
            tokens, status = (t[:m] if whole else t.index_select(0, pick)
                              for t in graph.sample_masked(rows_desc))
        else:
            logits = launched.logits
            z = logits if whole and m == logits.shape[0] else \
                logits[:m] if whole else logits.index_select(0, pick)  # [m, V]
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
        return self._after(self._pending(rows, index, results))

    @staticmethod
    def _pending(rows, index: list[int], results: dict[int, RowResult]) -> PendingBatch:
        if len(index) == len(rows):
            return PendingBatch(StepBatch(rows), tuple(results[i] for i in index))
        return PendingBatch(StepBatch(tuple(rows[i] for i in index)),
                            tuple(results[i] for i in index))

    def _reserve(self, rows: Sequence[BatchRow]) -> None:
        ahead = self.max_drafts + 1 if self.max_drafts else 0  # a proposer's KV past the frontier
        for r in rows:
            self.blocks.reserve(r.request.lane, min(r.end + ahead, self.max_len))
        self._hidden = []

    def commit(self, pending: PendingBatch, kept: Mapping[int, int]) -> None:
        """Commit the device state of the rows named: batch index -> how many of the tokens the
        row fed this step the model state keeps (all of them in ordinary decoding; the anchor
        and the accepted drafts when verifying). Rows not named commit nothing."""
        ahead, self._ahead = self._ahead is pending.batch, None
        if not kept:
            return
        if _recurrent(self.state) and not ahead:  # a dense KV cache has nothing to commit on the device
            # (and no device tensor is made: from pageable memory that would block the host
            # until the queued forward ends, which the Engine's pipeline overlaps with this)
            lanes = torch.tensor([pending.batch.rows[i].request.lane for i in kept], dtype=torch.int64)
            counts = torch.tensor(list(kept.values()), dtype=torch.int64)
            self.state.commit(lanes.to(self.device, non_blocking=True),
                              counts.to(self.device, non_blocking=True))
        for i, k in kept.items():
            row = pending.batch.rows[i]
            fed = tuple(row.tokens)
            if k > len(fed):  # drafts made on the device (DFlash): the accepted ones are the result's
                fed += tuple(pending.results[i].tokens[:k - len(fed)])
            self.blocks.commit(row.request.lane, row.start, fed[:k])

    def close(self) -> None:
        """Destroy graphs before the event and buffers they reference."""
        if self._graphs is not None:
            self._graphs.clear()
        if self._verify_graphs is not None:
            self._verify_graphs.clear()
        if self._dflash_graphs is not None:
            self._dflash_graphs.clear()
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    # ---------------------------------------------------------------- internals

    def _after(self, pending: PendingBatch) -> PendingBatch:
        """The proposer's alignment and next drafts from this step's hidden states."""
        if self.proposer is not None:
            device_drafts = getattr(self.proposer, "device_drafts", False)
            start = time.perf_counter()
            parts, self._hidden = self._hidden, []
            width = max(h.shape[1] for h in parts)
            hidden = torch.cat([torch.nn.functional.pad(h, (0, 0, 0, width - h.shape[1]))
                                for h in parts])  # [n, W, H]
            self.proposer.after_step(pending.batch.rows, hidden, pending.results)
            if not device_drafts:  # MTP: the host waited for the drafts' ids here (exposed)
                self._count_draft_wait(pending.batch.rows, time.perf_counter() - start)
        return pending

    def _count_draft_wait(self, rows: Sequence[BatchRow], seconds: float) -> None:
        self.draft_wait_seconds += seconds
        for row in rows:
            row.request.session.add_draft_wait(seconds)

    def _device_verify(self, batch: StepBatch) -> PendingBatch:
        """A DFlash round. Forward: the draft block on the device, its ids copied D2H into
        pinned memory, the ready event, the target forward over [anchor, drafts]; the host waits
        on the event only (not on the target forward), then fills the masks while the target
        forward runs, and acceptance follows (verify.py). Rows near the lane's end take the
        host route once their drafts are on the host."""
        rows, dev, proposer = batch.rows, self.device, self.proposer
        k, n = proposer.k, len(rows)
        anchors = torch.tensor([r.tokens[0] for r in rows], dtype=torch.int64).to(dev)  # [n]
        starts = torch.tensor([r.start for r in rows], dtype=torch.int64).to(dev)  # [n]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64).to(dev)  # [n]
        sampled = [r.request.sampling.temperature > 0 for r in rows]
        extra = {}
        if proposer.config.dflash2 and any(sampled):
            extra = {"temperature": torch.tensor([r.request.sampling.temperature for r in rows],
                                                 dtype=torch.float32).to(dev),
                     "seed": torch.tensor([r.request.seed for r in rows]).to(dev),
                     "out_pos": torch.tensor([r.request.num_output_tokens for r in rows]).to(dev)}
        fits = all(r.start + k + 1 <= self.max_len for r in rows)
        if self._dflash_graphs is not None and fits:
            return self._graphed_forward(batch, anchors, starts, lanes)
        waited = time.perf_counter()
        ids, q_ids, q_probs = proposer.block_drafts(anchors, starts, lanes, **extra)  # [n, K]
        self.host_drafts[:n].copy_(ids, non_blocking=self.cuda)
        if self._ready is not None:
            self._ready.record(torch.cuda.current_stream())
        waited = time.perf_counter() - waited  # launching (CUDA) or running (CPU) the draft
        logits = None
        if fits:
            tokens = torch.cat([anchors[:, None], ids], 1)  # [n, K+1]
            positions = starts[:, None] + torch.arange(k + 1, device=dev)[None]  # [n, K+1]
            logits = self._run_model(tokens, positions, lanes,
                                     kv_len=max(r.start for r in rows) + k + 1)  # [n, K+1, V]
        if self._ready is not None:
            start = time.perf_counter()
            self._ready.wait()  # the draft ids are on the host; the target forward still runs
            waited += time.perf_counter() - start
        self._count_draft_wait(rows, waited)
        drafted = self._drafted(rows, q_ids, q_probs, sampled)
        if logits is None:
            return self._verify(drafted)
        return PendingBatch(drafted, tuple(self.verifier.verify(drafted.rows, logits)))

    def _drafted(self, rows, q_ids, q_probs, sampled) -> StepBatch:
        # The rows with the drafts the host read back (each up to its own limit).
        host = self.host_drafts[:len(rows)].tolist()
        out = []
        for i, row in enumerate(rows):
            drafts = host[i][:row.draft_limit]
            q = (q_ids[i, :len(drafts)], q_probs[i, :len(drafts)]) \
                if q_ids is not None and sampled[i] and drafts else None
            out.append(replace(row, tokens=row.tokens + tuple(drafts), num_drafts=len(drafts),
                               draft_limit=0, draft_q=q))
        return StepBatch(tuple(out))

    def _graphed_forward(self, batch: StepBatch, anchors, starts, lanes) -> PendingBatch:
        """The captured DFlash Forward (graphs.py): replay, wait on the external event (the ids
        are on the host while the target forward still runs), masks and acceptance after."""
        rows, n = batch.rows, len(batch.rows)
        graph, captured = self._dflash_graphs.get(n)
        if captured:
            log.info("dflash_forward_graph_captured", batch_size=graph.size)
        start = time.perf_counter()
        graph.run(anchors, starts, lanes)
        self._ready.wait()
        self._count_draft_wait(rows, time.perf_counter() - start)
        self._hidden.append(graph.feats[:n])  # [n, K+1, n_layers * H]
        drafted = self._drafted(rows, None, None, [False] * n)
        return PendingBatch(drafted, tuple(self.verifier.verify(drafted.rows, graph.logits[:n])))

    def _run_model(self, tokens, positions, lanes, *, kv_len, logit_index=None, num_tokens=None):
        # Logits; with a proposer through hidden_states + logits, keeping what it reads: the
        # final hidden states (MTP) or the tapped layers' outputs (DFlash, a dense target).
        if self.proposer is None:
            return self.model(tokens, positions, self.state, lanes, kv_len=kv_len,
                              logit_index=logit_index, num_tokens=num_tokens)
        if self._tap:
            hidden, kept = self.model.hidden_states(tokens, positions, self.state, lanes,
                                                    kv_len=kv_len, tap=self._tap)
        else:
            hidden = kept = self.model.hidden_states(tokens, positions, self.state, lanes,
                                                     kv_len=kv_len, num_tokens=num_tokens)
        self._hidden.append(kept)  # [n, T, H']
        if logit_index is not None:
            hidden = hidden.gather(1, logit_index[:, :, None].expand(-1, -1, hidden.shape[-1]))
        return self.model.logits(hidden)

    def _row_result(self, j: int, row: BatchRow, fill, token: int, status: int) -> RowResult:
        if j in fill.dead_ends:
            return RowResult(RowOutcome.DEAD_END, error=fill.dead_ends[j])
        if status == SampleStatus.OK:
            return RowResult(RowOutcome.TOKENS, (token,), mask_bytes=fill.upload_bytes.get(j, 0))
        what = "non-finite logits" if status == SampleStatus.NONFINITE else \
            "an empty legal set on the device after the CPU mask said Ready"
        return RowResult(RowOutcome.NONFINITE, error=InternalError(
            f"sampling found {what} at output position {row.request.num_output_tokens}"))

    def _verify(self, batch: StepBatch) -> PendingBatch:
        """A verification round (host-launched route: drafts fixed on the host before the
        forward, masks filled while it runs, acceptance after it; verify.py)."""
        assert self.verifier is not None and all(
            r.sample and len(r.tokens) == 1 + r.num_drafts <= 1 + self.max_drafts
            for r in batch.rows), "drafts need a Program built with max_drafts >= K"
        rows = batch.rows
        width = max(len(r.tokens) for r in rows)
        full = self.max_drafts + 1
        if self._verify_graphs is not None and all(r.start + full <= self.max_len for r in rows):
            return PendingBatch(batch, tuple(self.verifier.verify(rows, self._verify_graph(rows))))
        if any(r.start + width > self.max_len for r in rows):  # padding would leave the lane
            logits = torch.cat([self._pad(self._prefill((r,), len(r.tokens), every=True), width)
                                for r in rows])
        else:
            logits = self._prefill(rows, width, every=True)  # [n, W, V]
        return PendingBatch(batch, tuple(self.verifier.verify(rows, logits)))

    def _verify_graph(self, rows: Sequence[BatchRow]) -> torch.Tensor:
        # The replayed verify graph: rows padded to K+1 tokens at the following positions.
        full, dev = self.max_drafts + 1, self.device
        tokens = torch.zeros(len(rows), full, dtype=torch.int64)  # [n, K+1]
        for i, r in enumerate(rows):
            tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
        positions = torch.tensor([r.start for r in rows])[:, None] + torch.arange(full)[None]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)
        graph, captured = self._verify_graphs.get(len(rows))
        if captured:
            log.info("verify_graph_captured", batch_size=graph.size, width=full)
        logits = graph.run(tokens.to(dev, non_blocking=True),
                           positions.to(dev, non_blocking=True),
                           lanes.to(dev, non_blocking=True))  # [n, K+1, V]
        if graph.hidden is not None:  # kept for the MTP proposer
            self._hidden.append(graph.hidden[:len(rows)])
        return logits

    @staticmethod
    def _pad(logits: torch.Tensor, width: int) -> torch.Tensor:
        # logits: [1, w, V] -> [1, width, V] (zeros: positions the acceptance walk never reaches)
        return torch.cat([logits, logits.new_zeros(1, width - logits.shape[1], logits.shape[2])], 1)

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
                logits = graph.run(inputs[:, 0:1], inputs[:, 1:2], inputs[:, 2])
                if graph.hidden is not None:  # kept for the MTP proposer
                    self._hidden.append(graph.hidden[:n])
                return logits
            kv_len = max(r.start for r in rows) + 1
            return self._run_model(tokens.to(dev), positions.to(dev), lanes.to(dev),
                                   kv_len=kv_len)[:, -1]
        width = max(len(r.tokens) for r in rows)
        if any(r.start + width > self.max_len for r in rows):  # padding would leave the lane
            return torch.cat([self._prefill((r,), len(r.tokens)) for r in rows])
        return self._prefill(rows, width)

    def _prefill(self, rows: Sequence[BatchRow], width: int, *, every: bool = False) -> torch.Tensor:
        # Rows padded on the right to `width` at the following positions (all < max_len).
        # Logits [n, V] after each row's last real token, or with `every` [n, width, V].
        dev = self.device
        tokens = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        positions = torch.zeros(len(rows), width, dtype=torch.int64)  # [n, T]
        for i, r in enumerate(rows):
            tokens[i, :len(r.tokens)] = torch.tensor(r.tokens)
            positions[i] = torch.arange(r.start, r.start + width)
        fed = torch.tensor([len(r.tokens) for r in rows], dtype=torch.int64)  # [n]
        lanes = torch.tensor([r.request.lane for r in rows], dtype=torch.int64)  # [n]
        kv_len = max(r.start for r in rows) + width
        if not every and self.blocks.snapshots:  # a hybrid model's prefix-cache snapshots
            self.state.cut_next([(i, t, slot) for i, r in enumerate(rows)
                                 for t, slot in self.blocks.plan_snapshots(
                                     r.request.lane, r.request.prompt_ids, r.start, r.end)])
        index = None if every else (fed - 1)[:, None].to(dev)
        out = self._run_model(tokens.to(dev), positions.to(dev), lanes.to(dev), kv_len=kv_len,
                              logit_index=index, num_tokens=fed.to(dev))  # [n, 1|T, V]
        return out if every else out[:, 0]


def model_identity(runtime: ModelRuntime) -> str:
    """What the prefix cache's hash chain starts from: the served name, the weights' source,
    architecture and dtype (an adapter would join here)."""
    source = getattr(runtime.model, "source_path", None)
    return f"{runtime.name}|{source}|{type(runtime.model).__name__}|{runtime.dtype}"


def _kv(state) -> KVCache:
    return state if isinstance(state, KVCache) else state.kv


def _recurrent(state) -> bool:
    return not isinstance(state, KVCache)
