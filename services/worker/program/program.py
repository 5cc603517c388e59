"""The Program: lanes, model state, mask buffers, graphs and sampling of one served model.

Everything is allocated once at start from the model and the capacity plan: the model's per-lane
state (`model.new_state`: a dense model's paged KV cache; plus one scratch lane, whose block table
names only the trash block, for the padding rows of decode graphs), the block manager and prefix
cache over its KV pool (blocks.py: `step` backs each row's new positions with blocks, `commit`
adds full committed blocks to the cache, `attach_prefix` starts an admitted lane from it), the
mask buffers (masks.py), the sampler (sampling.py), the model's forwards (forward.py), and on CUDA
the decode graphs (graphs.py), the short prefill forwards' graphs (prefill_graphs.py) and the
ready event (events.py). A speculative proposer
(services/worker/spec) is handed over once (`use`); the Program calls only its interface.

`step(batch)` runs one forward for the batch's rows (a verification round when rows carry drafts
or draft limits: rounds.py, verify.py), fills the constrained rows' masks on the CPU while the
forward runs on CUDA, samples with the mask fused before candidate selection, and
returns a `PendingBatch` with each row's result: tokens, a constraint dead end, non-finite logits,
or no output (an intermediate prefill chunk). `commit(pending, accepted)` commits device state
only (the model state of the accepted prefixes); ledgers are the Request's, published text the
commit path's. A row left out of `accepted` leaves no trace: its stray KV writes lie beyond the
committed frontier and are overwritten before being read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from kernels.sampling_contract import SampleStatus
from services.settings import switch
from services.worker.models.kv_cache import KVCache
from services.worker.program.batch import BatchRow, PendingBatch, RowOutcome, RowResult, StepBatch
from services.worker.program.blocks import BlockManager, model_identity
from services.worker.program.budget import new_state
from services.worker.program.events import ReadyEvent
from services.worker.program.forward import Forward
from services.worker.program.graphs import DecodeGraphs
from services.worker.program.logprobs import LogprobReader, LogprobSite
from services.worker.program.masks import MaskBuffers
from services.worker.program.prefill_graphs import PrefillGraphs
from services.worker.program.rounds import Rounds
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
    least 8), paid from `kv_budget_bytes` when max_len comes from it, and so is
    `context_bytes_per_position`: a draft model's context cache beside the state, bytes per lane
    position (budget.py; the proposer allocates it over this state's lanes). A speculative
    proposer is handed over once by `use`."""

    def __init__(self, runtime: ModelRuntime, *, max_batch: int, max_len: int | None = None,
                 kv_budget_bytes: int = 256 << 20, max_drafts: int = 0,
                 cuda_graphs: bool = True, prefix_cache: bool = True,
                 kv_cache_tokens: int | None = None, state_snapshots: int | None = None,
                 logprobs_mode: str = "processed", context_bytes_per_position: int = 0) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.runtime = runtime
        self.model = runtime.model
        self.domain = runtime.domain
        self.device = runtime.device
        self.cuda = self.device.type == "cuda"
        self.max_batch = max_batch
        self.max_drafts = max_drafts
        self._use_graphs = self.cuda and cuda_graphs
        lanes = max_batch + (1 if self._use_graphs else 0)  # + the scratch lane of padding rows
        snapshots = max(8, 2 * max_batch) if state_snapshots is None else state_snapshots
        self.state = new_state(runtime, lanes, max_len, kv_budget_bytes=kv_budget_bytes,
                               max_drafts=max_drafts, snapshots=snapshots if prefix_cache else 0,
                               kv_cache_tokens=kv_cache_tokens,
                               context_bytes_per_position=context_bytes_per_position)
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
                 draft_context_bytes=lanes * self.max_len * context_bytes_per_position,
                 snapshot_bytes=snapshots * getattr(self.model, "snapshot_bytes",
                                                    lambda dtype: 0)(runtime.dtype))
        self.masks = MaskBuffers(self.domain, max_batch, max_drafts, self.device)
        self.sampler = Sampler(self.domain, self.device)
        self.logprobs = LogprobReader(self.domain, self.device, logprobs_mode)
        verifier = Verifier(self.domain, self.device, self.masks, self.sampler,
                            max_drafts, self.logprobs) if max_drafts > 0 else None
        pin = self.cuda
        self.host_tokens = torch.zeros(max_batch, dtype=torch.int64, pin_memory=pin)  # [B]
        self.host_status = torch.zeros(max_batch, dtype=torch.int32, pin_memory=pin)  # [B]
        # a constrained decode step's mask descriptor per decode-graph row (-1: unconstrained)
        self.host_graph_row = torch.full((max_batch,), -1, dtype=torch.int32, pin_memory=pin)  # [B]
        self._free = list(range(max_batch))
        self._ahead: StepBatch | None = None  # the step whose device state commit_ahead committed
        self._ready = ReadyEvent() if self.cuda else None
        self.forward = Forward(self.model, self.state, self.max_len, max_batch, self.device)
        if self.blocks.snapshots:
            self.forward.snapshots = self.blocks
        self.rounds = Rounds(self.forward, verifier, max_batch=max_batch, max_drafts=max_drafts,
                             ready=self._ready)
        self._proposer = None  # aligned with and drafting after every step (`use`)
        self._graph_forwards(keep_hidden=False)
        if self._use_graphs and switch("prefill_graphs"):
            self.forward.prefill_graphs = PrefillGraphs(self.model, self.state, max_batch,
                                                        scratch_lane=max_batch)

    def use(self, proposer) -> None:
        """Serve with a speculative proposer (services/worker/spec/proposer.py: `route`, `k`,
        `reads`, `after_step`; on the device route `block_drafts`, `eager_drafts`), built over
        this Program's state; call once before the first step. Its `after_step` follows every step;
        a device-route proposer drafts inside verify rounds, whose Forward is captured as one
        graph per batch size (the decode graphs are then not captured: its ordinary steps run
        eagerly)."""
        self._proposer = proposer
        self.forward.reads = proposer.reads
        if proposer.route == "device":
            self.forward.graphs = self.forward.verify_graphs = None
            self.rounds.use_device_proposer(proposer, graphs=self._use_graphs)
        else:
            self._graph_forwards(keep_hidden=proposer.reads is not None)
            capture = self.proposer_member("use_graphs")
            if self._use_graphs and capture is not None and switch("mtp_graphs"):
                capture(self.max_batch, scratch_lane=self.max_batch)

    def _graph_forwards(self, *, keep_hidden: bool) -> None:
        # The decode graphs (and the host-launched route's verify graphs, K+1 tokens a row),
        # keeping the final hidden states for a proposer that reads them; captured on first use.
        if not self._use_graphs:
            return
        held = self.forward.graphs
        if held is not None and held.keep_hidden == keep_hidden and \
                (self.max_drafts == 0 or self.forward.verify_graphs is not None):
            return  # a proposer reading the same: the graphs captured so far (the warm-up's) hold
        sampler, masks = self.sampler, self.masks
        self.forward.graphs = DecodeGraphs(
            self.model, self.state, self.max_batch, scratch_lane=self.max_batch,
            keep_hidden=keep_hidden,
            sample_stage=lambda: sampler.greedy_in_graph,
            masked_stage=lambda: (sampler.masked_greedy_in_graph, masks.device_masks)
            if sampler.graph_masked else None)
        if self.max_drafts > 0:
            self.forward.verify_graphs = DecodeGraphs(
                self.model, self.state, self.max_batch, scratch_lane=self.max_batch,
                width=self.max_drafts + 1, keep_hidden=keep_hidden)

    def proposer_member(self, name: str):
        """The proposer's optional host-route member `name` (spec/proposer.py: `use_graphs`,
        `warm_graphs`, `warm_prefill`, `close`), or None: no proposer, a device-route one, or
        one without it."""
        proposer = self._proposer
        if proposer is None or proposer.route != "host":
            return None
        return getattr(proposer, name, None)

    @property
    def draft_wait_seconds(self) -> float:
        """Host time waiting for a model proposer's drafts (MTP, DFlash) so far."""
        return self.rounds.draft_wait_seconds

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
        """Forward, masks, sampling for every row of `batch` (at most B rows, distinct lanes): a
        verification round when rows carry drafts or draft limits, else `launch` + `finish`."""
        rows = batch.rows
        assert 0 < len(rows) <= self.max_batch
        if any(r.draft_limit for r in rows):  # the proposer drafts on the device (rounds.py)
            self._reserve(rows)
            return self._after(self.rounds.device(batch))
        if batch.has_drafts:  # drafts fixed on the host (rounds.py)
            self._reserve(rows)
            return self._after(self.rounds.host(batch))
        return self.finish(self.launch(batch))

    @property
    def recurrent(self) -> bool:
        """Whether the model state holds recurrent state (a hybrid model) beside its KV."""
        return _recurrent(self.state)

    def commit_ahead(self, pending: PendingBatch) -> None:
        """Commit the device state of an ordinary decode step's rows (one fed token each) before
        the commit path previews them, for a next step launched first (engine/pipeline.py) whose
        forward must read the state after this one (a hybrid model's recurrent state; a dense KV
        cache needs nothing). `commit(pending, ...)` then skips the device part for these rows."""
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
        logits = self.forward.run(batch)  # [n, V] logits after each row's last fed token
        return Launched(batch, logits, self.forward.last_graph)

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
        pick = (
            None
            if whole
            else torch.tensor(sampled, dtype=torch.int64).to(self.device, non_blocking=True)
        )
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
        self._read_logprobs(launched.logits, sampled, requests, host_tokens, results)
        return self._after(self._pending(rows, index, results))

    def _read_logprobs(self, logits, sampled, requests, tokens, results) -> None:
        # The rows that asked, after sampling, from the logits it read (a graph's stay valid
        # until its next replay); a row's mask is position 0 of its host buffer.
        asked = [(j, i) for j, i in enumerate(sampled) if requests[j].logprobs is not None
                 and results[i].outcome is RowOutcome.TOKENS]
        if not asked:
            return
        sites = [LogprobSite(requests[j], logits[i], self.masks.host[j, 0]
                             if int(self.masks.host_row[j]) >= 0 else None, tokens[j])
                 for j, i in asked]
        for (_, i), entry in zip(asked, self.logprobs.read(sites)):
            results[i] = replace(results[i], logprobs=(entry,))

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
        self.forward.reset()

    def commit(self, pending: PendingBatch, kept: Mapping[int, int]) -> None:
        """Commit the device state of the rows named: batch index -> how many of the tokens the
        row fed this step the model state keeps (all of them in ordinary decoding; the anchor
        and the accepted drafts when verifying). Rows not named commit nothing."""
        ahead, self._ahead = self._ahead is pending.batch, None
        if not kept:
            return
        if (
            _recurrent(self.state) and not ahead
        ):  # a dense KV cache has nothing to commit on the device
            # (and no device tensor is made: from pageable memory that would block the host
            # until the queued forward ends, which the Engine's pipeline overlaps with this)
            lanes = torch.tensor(
                [pending.batch.rows[i].request.lane for i in kept], dtype=torch.int64
            )
            counts = torch.tensor(list(kept.values()), dtype=torch.int64)
            self.state.commit(lanes.to(self.device, non_blocking=True),
                              counts.to(self.device, non_blocking=True))
        for i, k in kept.items():
            row = pending.batch.rows[i]
            fed = tuple(row.tokens)
            if k > len(
                fed
            ):  # drafts made on the device (DFlash): the accepted ones are the result's
                fed += tuple(pending.results[i].tokens[:k - len(fed)])
            self.blocks.commit(row.request.lane, row.start, fed[:k])

    def close(self) -> None:
        """Destroy graphs before the event and buffers they reference."""
        for graphs in (self.forward.graphs, self.forward.verify_graphs,
                       self.forward.prefill_graphs):
            if graphs is not None:
                graphs.clear()
        self.rounds.close()
        close = self.proposer_member("close")
        if close is not None:
            close()
        if self._ready is not None:
            self._ready.close()
            self._ready = None

    # ---------------------------------------------------------------- internals

    def _after(self, pending: PendingBatch) -> PendingBatch:
        """The proposer's alignment and next drafts from what this step's forwards kept."""
        if self._proposer is not None:
            waited = self._proposer.after_step(pending, self.forward.kept())
            if waited:  # the host waited for the next round's drafts here (exposed)
                self.rounds.count_draft_wait(pending.batch.rows, waited)
        return pending

    def _row_result(self, j: int, row: BatchRow, fill, token: int, status: int) -> RowResult:
        if j in fill.dead_ends:
            return RowResult(RowOutcome.DEAD_END, error=fill.dead_ends[j])
        if status == SampleStatus.OK:
            return RowResult(RowOutcome.TOKENS, (token,), mask_bytes=fill.upload_bytes.get(j, 0))
        what = "non-finite logits" if status == SampleStatus.NONFINITE else \
            "an empty legal set on the device after the CPU mask said Ready"
        return RowResult(RowOutcome.NONFINITE, error=InternalError(
            f"sampling found {what} at output position {row.request.num_output_tokens}"))


def _kv(state) -> KVCache:
    return state if isinstance(state, KVCache) else state.kv


def _recurrent(state) -> bool:
    return not isinstance(state, KVCache)
