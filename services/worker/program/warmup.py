"""The Program's warm-up: every forward shape the server can meet, run once before it serves, so
no kernel compiles (and no autotuner benchmarks) on the request path.

What it visits (buckets.py bounds the set):

- a prefill forward per padded width (`prefill_widths`) and batch-size class (`graph_sizes`:
  1, 2, 4, ... B) that one step can hold (the widest row plus one token per other row within the
  step's `prefill_chunk`), from the start of the lanes; the small ones (few rows x few tokens,
  where the attention kernel splits the context; one width per kernel variant below 32 tokens)
  also at each context bound of `context_bounds`, which chooses those splits;
- every prefill graph (prefill_graphs.py `graph_shapes`: each width bucket of a short prefill
  forward per batch-size class; capturing it runs its forward twice first, which compiles its
  kernels), timed and its memory measured apart (`prefill_graph_seconds`, `prefill_graph_bytes`);
- every decode graph size (capturing it: its forward, greedy and masked greedy sample stages)
  and every verify graph size when drafts are verified in graphs; where a step runs eagerly (no
  graphs) a decode forward per batch-size class and context bound instead;
- acceptance of a speculative round (verify.py `Verifier.warm`) per batch-size class, greedy
  and sampled, without and with a mask; and per class a K+1-token forward on free lanes committed
  at its first token (a hybrid model's replay kernels: a round that rejects drafts);
- a host proposer's own graphs (`warm_graphs`: MTP's draft pass per padded size and alignment
  width, writing the scratch lane only) and its passes over prompt chunks at every prefill shape
  above (`warm_prefill`: MTP's alignment, padded to the same widths);
- fla-core's chunked kernels at every row count (they compile and autotune per batch size);
- the eager sampler per batch-size class: greedy, top-p, top-k per power of two and penalized,
  each without and with a mask (what a tempered, penalized or constrained batch runs outside
  the decode graph).

The warm-up writes only what a request overwrites before reading: the free lanes' positions
past their (empty) committed frontier, a hybrid model's uncommitted recurrent buffers (a request
at position 0 resets its lane); the prefix cache is still empty and nothing is committed.
`forward` (tests) replaces the model call of the prefill and eager decode shapes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import torch

from services.worker.program.buckets import (
    EXACT_WIDTHS,
    PREFILL_STEP,
    context_bounds,
    prefill_widths,
)
from services.worker.program.graphs import graph_sizes
from services.worker.program.prefill_graphs import graph_shapes
from shared.generation import SamplingParams
from shared.logging import get_logger

# Forwards of at most this many tokens in all are also warmed at each context bound: beyond it
# the attention kernel has programs enough for the GPU without splitting the context.
SPLIT_TOKENS = 2048

log = get_logger(__name__)


@dataclass
class WarmupReport:
    """What the warm-up ran: shapes per kind, and how long it took."""

    prefill: int = 0  # prefill forwards (width x rows x context bound)
    decode: int = 0  # eager decode forwards (rows x context bound)
    decode_graphs: int = 0  # decode graph sizes captured
    verify_graphs: int = 0  # verify graph sizes captured (host-launched speculation)
    draft_graphs: int = 0  # DFlash Forward graph sizes captured (device-route speculation)
    proposer_graphs: int = 0  # a host proposer's own graphs (MTP's draft pass: sizes x widths)
    proposer_prefill: int = 0  # a host proposer's passes at the prefill shapes (MTP's alignment)
    acceptance: int = 0  # acceptance runs (sizes x greedy/sampled x masked/not)
    commits: int = 0  # partial commits after a K+1-token forward (a hybrid model's replay)
    sampling: int = 0  # eager sampler variants (rows x greedy/tempered x masked/not)
    prefill_graphs: int = 0  # prefill graph shapes captured (rows x width)
    prefill_graph_seconds: float = 0.0  # of `seconds`: capturing them
    prefill_graph_bytes: int = 0  # device memory the captures reserved
    seconds: float = 0.0
    shapes: list[tuple] = field(default_factory=list, repr=False)  # (kind, rows, width, kv_len)

    def to_dict(self) -> dict:
        return {"prefill": self.prefill, "decode": self.decode,
                "decode_graphs": self.decode_graphs, "verify_graphs": self.verify_graphs,
                "draft_graphs": self.draft_graphs, "proposer_graphs": self.proposer_graphs,
                "proposer_prefill": self.proposer_prefill,
                "acceptance": self.acceptance, "commits": self.commits,
                "sampling": self.sampling,
                "prefill_graphs": self.prefill_graphs,
                "prefill_graph_seconds": round(self.prefill_graph_seconds, 3),
                "prefill_graph_bytes": self.prefill_graph_bytes,
                "seconds": round(self.seconds, 3)}


def prefill_shapes(prefill_chunk: int, max_batch: int, max_len: int) -> list[tuple[int, int, int]]:
    """(rows, width, kv_len) of every prefill forward the warm-up runs (module docstring)."""
    shapes = []
    for width in prefill_widths(prefill_chunk, max_len):
        least = width if width <= EXACT_WIDTHS else width - PREFILL_STEP + 1  # narrowest real row
        for rows in graph_sizes(max_batch):
            if least + rows - 1 > max(prefill_chunk, width):  # no step holds it
                continue
            split = rows * width <= SPLIT_TOKENS and (width > EXACT_WIDTHS
                                                      or width in _split_classes())
            bounds = context_bounds(max_len, width) if split else (width,)
            shapes.extend((rows, width, kv_len) for kv_len in bounds)
    # fla-core's chunked gated delta rule compiles and autotunes per batch size (its cumsum
    # kernel takes B as a compile-time constant and an autotuning key): every row count once at
    # the narrowest chunked width (its length is not a key: T is never specialized there).
    chunked = [w for w in prefill_widths(prefill_chunk, max_len) if w > EXACT_WIDTHS]
    if chunked:
        width = chunked[0]
        classes = set(graph_sizes(max_batch))
        shapes.extend((rows, width, width) for rows in range(1, max_batch + 1)
                      if rows not in classes and width - PREFILL_STEP + rows <= prefill_chunk)
    return shapes


def _split_classes() -> set[int]:
    # One width per kernel variant of the narrow forwards: the attention kernel's query block
    # follows next_power_of_2(width x heads per KV head) and Triton specializes the width on
    # being 1 or a multiple of 16; the smallest width of each such class represents it.
    seen: dict[tuple, int] = {}
    for w in range(EXACT_WIDTHS, 0, -1):
        seen[(1 << (w - 1).bit_length(), w == 1, w % 16 == 0)] = w
    return set(seen.values())


@torch.inference_mode()
def warm_up(program, prefill_chunk: int, *, forward=None) -> WarmupReport:
    """Run every shape of the module docstring on `program` (before it serves); returns the
    report. `forward(tokens [n, T], positions [n, T], lanes [n], kv_len, fed [n])` replaces the
    model call of prefill and eager decode forwards (default: the Program's own)."""
    start = time.perf_counter()
    report = WarmupReport()
    run = forward if forward is not None else _model_forward(program)
    dev, max_len, max_batch = program.device, program.max_len, program.max_batch
    shapes = prefill_shapes(prefill_chunk, max_batch, max_len)
    for rows, width, kv_len in shapes:
        tokens, positions, lanes, fed = _inputs(rows, width, kv_len - width, dev)
        run(tokens, positions, lanes, kv_len, fed)
        report.prefill += 1
        report.shapes.append(("prefill", rows, width, kv_len))
    warm_prefill = program.proposer_member("warm_prefill")
    if warm_prefill is not None:
        report.proposer_prefill = warm_prefill(shapes)  # MTP's alignment of prompt chunks
    fwd = program.forward
    if fwd.prefill_graphs is not None:
        _capture_prefill_graphs(program, prefill_chunk, report)
    if fwd.graphs is not None:
        for size in graph_sizes(max_batch):
            fwd.graphs.get(size)
            report.decode_graphs += 1
            report.shapes.append(("decode_graph", size, 1, max_len))
    else:
        for rows in graph_sizes(max_batch):
            for kv_len in context_bounds(max_len, 1):
                tokens, positions, lanes, fed = _inputs(rows, 1, kv_len - 1, dev)
                run(tokens, positions, lanes, kv_len, fed)
                report.decode += 1
                report.shapes.append(("decode", rows, 1, kv_len))
    if fwd.verify_graphs is not None:
        for size in graph_sizes(max_batch):
            fwd.verify_graphs.get(size)
            report.verify_graphs += 1
            report.shapes.append(("verify_graph", size, program.max_drafts + 1, max_len))
    if program.rounds.graphs is not None:
        for size in graph_sizes(max_batch):
            program.rounds.graphs.get(size)
            report.draft_graphs += 1
            report.shapes.append(("draft_graph", size, program.max_drafts + 1, max_len))
    if program.max_drafts > 0:  # a verify forward, then a partial commit (a hybrid's replay)
        width = program.max_drafts + 1
        for rows in graph_sizes(max_batch):
            tokens, positions, lanes, fed = _inputs(rows, width, 0, dev)
            run(tokens, positions, lanes, width, fed)
            program.state.commit(lanes, torch.ones(rows, dtype=torch.int64, device=dev))
            report.commits += 1
    verifier = program.rounds.verifier
    if verifier is not None:  # acceptance of a speculative round, greedy and sampled, masked or not
        kinds = [_fake_request(SamplingParams(temperature=0.0), False),
                 _fake_request(SamplingParams(temperature=1.0, top_p=0.9), False)]
        report.acceptance = verifier.warm(graph_sizes(max_batch), kinds, program.runtime.dtype)
    warm = program.proposer_member("warm_graphs")
    if warm is not None:
        report.proposer_graphs = warm()
    _warm_sampler(program, report)
    fwd.reset()
    if program.cuda:
        torch.cuda.synchronize(dev)
    report.seconds = time.perf_counter() - start
    return report


def _capture_prefill_graphs(program, prefill_chunk: int, report: WarmupReport) -> None:
    graphs, dev = program.forward.prefill_graphs, program.device
    torch.cuda.synchronize(dev)
    # A capture empties the allocator's cache (torch.cuda.graph does), which returns the blocks
    # the eager prefill shapes above left cached: measured from an empty cache, the difference is
    # what the graphs' pools hold (measured from a full one it read -8.8 GB on the H200).
    torch.cuda.empty_cache()
    start, reserved = time.perf_counter(), torch.cuda.memory_reserved(dev)
    for rows, width in graph_shapes(program.max_batch, prefill_chunk, program.max_len):
        graph, _ = graphs.get(rows, width)
        if graph is None:
            log.warning("prefill_graph_failed", batch_size=rows, width=width)
            continue
        report.prefill_graphs += 1
        report.shapes.append(("prefill_graph", rows, width, program.max_len))
    torch.cuda.synchronize(dev)
    report.prefill_graph_seconds = time.perf_counter() - start
    report.prefill_graph_bytes = torch.cuda.memory_reserved(dev) - reserved


def _inputs(rows: int, width: int, start: int, dev):
    tokens = torch.zeros(rows, width, dtype=torch.int64, device=dev)  # [n, T]
    positions = (start + torch.arange(width, device=dev))[None].expand(rows, width).contiguous()
    lanes = torch.arange(rows, dtype=torch.int64, device=dev)  # [n] free lanes 0..n-1
    fed = torch.full((rows,), width, dtype=torch.int64, device=dev)  # [n]
    return tokens, positions, lanes, fed


def _model_forward(program):
    # The Program's prefill call (forward.py `prefill`: logits of each row's last real token).
    def run(tokens, positions, lanes, kv_len, fed):
        program.forward.logits(tokens, positions, lanes, kv_len=kv_len,
                               logit_index=(fed - 1)[:, None], num_tokens=fed)
    return run


def _fake_request(params: SamplingParams, penalized: bool):
    # What the Sampler reads of a request (sampling.py): its parameters, seed, position, history.
    return SimpleNamespace(sampling=params, seed=0, num_output_tokens=0,
                           penalized=lambda: penalized, penalty_history=lambda: ([1], [1]))


def _warm_sampler(program, report: WarmupReport) -> None:
    sampler, masks = program.sampler, program.masks
    logits = torch.zeros(program.max_batch, program.domain.size, dtype=program.runtime.dtype,
                         device=program.device)  # [B, V]
    # greedy, top-p, and top-k at each power of two (the kernels' candidate block follows it),
    # then greedy and tempered with penalties (their own kernel variants)
    kinds = [(SamplingParams(temperature=0.0), False),
             (SamplingParams(temperature=1.0, top_p=0.9), False)]
    kinds += [(SamplingParams(temperature=1.0, top_k=1 << i), False) for i in range(11)]
    # a width that is no multiple of 16 in each candidate block from 32 up (Triton specializes an
    # int argument on divisibility by 16, jointly with the block: top_k 20 is such a pair)
    kinds += [(SamplingParams(temperature=1.0, top_k=(1 << i) + 1), False) for i in range(4, 11)]
    kinds += [(SamplingParams(temperature=0.0, presence_penalty=0.5), True),
              (SamplingParams(temperature=1.0, repetition_penalty=1.1), True)]
    for rows in graph_sizes(program.max_batch):
        for params, penalized in kinds:
            requests = [_fake_request(params, penalized) for _ in range(rows)]
            for masked in (False, True):
                mask = mask_row = None
                if masked:  # an all-empty mask per row: the kernels' masked variant
                    masks.host_row[:rows] = torch.arange(rows, dtype=torch.int32) * masks.stride
                    mask, mask_row = masks.upload(rows)
                sampler.sample(logits[:rows], requests, mask, mask_row)
                report.sampling += 1
                report.shapes.append(("sample", rows, params.temperature, masked, params.top_k,
                                      penalized))
    masks.host_row.fill_(-1)
    sampler._members, sampler._static = [], None  # the next real batch rebuilds its parameters


def warm_up_logged(program, prefill_chunk: int, metrics) -> WarmupReport | None:
    """`warm_up` with its start and end logged and its counts in `metrics` (WorkerMetrics). A
    failure is logged and serving goes on (kernels then compile on first use): returns None."""
    try:
        log.info("warmup_started", prefill_chunk=prefill_chunk, max_batch=program.max_batch,
                 max_len=program.max_len)
        report = warm_up(program, prefill_chunk)
    except Exception:
        log.exception("warmup_failed")
        return None
    counts = report.to_dict()
    log.info("warmup_finished", **counts)
    metrics.warmup_seconds.set(report.seconds)
    for kind, value in counts.items():
        if kind != "seconds" and not kind.startswith("prefill_graph_"):
            metrics.warmup_shapes.labels(kind=kind).set(value)
    return report
