"""What the speculative acceptance kernels take and return (design document section 8).

A round verifies, per row b, the row's own n_b <= K drafts d_0..d_{n_b-1} (never constrained) with
the target's logits at the K+1 positions of `[anchor, d_0, ..., d_{K-1}]`: position i holds the
target's next-token logits after committed output + d_0..d_{i-1}. Logits row b * (K+1) + i.

Per position, the lookahead's descriptor (`PositionState`, the design's table) says how the mask
is consumed: DISABLED (unconstrained row: the mask is never read), READY (mask[b, i] applies
before candidate filtering), DEAD_END (that hypothetical prefix has no legal next token: the row
fails only if the walk reaches it), UNREACHABLE (after an illegal draft or an accepted EOS: a
filler, nothing is emitted there). The first illegal draft's position is READY with the legal
prefix's mask, so its p(d) = 0 and it is rejected normally, never dropped.

p_i is the ordinary sampling distribution at position i (`kernels.sampling_contract`: penalties
over the same hypothetical prefix, the legal mask, temperature, top-k, min-p, top-p), with the RNG
at logical position params.position[b] + i. The walk, for i = 0, 1, ...:

- UNREACHABLE: stop, nothing emitted at i;
- DEAD_END, or p_i has no finite legal candidate: the row fails (status DEAD_END / NONFINITE),
  it commits zero tokens;
- i == n_b (every draft accepted): emit the bonus, sampled from p_i (purpose SAMPLE), stop;
- greedy row (T = 0): accept d_i iff d_i is the argmax over legal candidates (ties to the smaller
  id), otherwise emit that argmax and stop;
- T > 0: accept d_i iff u < p_i(d_i) / q_i(d_i) with u of purpose ACCEPT; one-hot q (n-gram, MTP,
  DFlash) has q_i(d_i) = 1; sparse q (DFlash2, 16 candidates) is the drafter's real
  distribution. On rejection emit a token drawn (purpose RESIDUAL) from the residual
  (p_i - q_i)+ normalised: for one-hot q, p_i without d_i. Stop.
- after an accepted draft in `eos_ids` stop (optional; constrained rows stop anyway, since the
  position after an accepted EOS is UNREACHABLE).

q_i(d_i) = 0 (a draft its own q could not produce) makes the ratio undefined: the row fails as
NONFINITE. If rounding leaves no residual mass after a rejection, the most likely candidate of p_i
is emitted (exact arithmetic never gets there).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import torch

from kernels.sampling_contract import PenaltyHistory, SamplingParams, mask_words


class PositionState(IntEnum):
    """Per-position mask descriptor of a speculative round (values are stored on the device)."""

    DISABLED = 0  # unconstrained row
    READY = 1  # the position's legal mask is built
    DEAD_END = 2  # the hypothetical prefix has no legal next token
    UNREACHABLE = 3  # after an illegal draft or an accepted EOS


@dataclass(frozen=True)
class AcceptResult:
    """Per-row outcome of one verification round."""

    tokens: torch.Tensor  # [B, K+1] int64: the emitted tokens in [:num_tokens], 0 beyond
    num_tokens: torch.Tensor  # [B] int32: emitted tokens (accepted drafts + correction/bonus)
    accepted: torch.Tensor  # [B] int32: accepted drafts (0 for a failed row)
    status: torch.Tensor  # [B] int32, SampleStatus: OK, DEAD_END or NONFINITE (commit nothing)
    end: torch.Tensor  # [B] int32: the position index where the walk stopped


def check_accept_inputs(logits: torch.Tensor, params: SamplingParams, drafts: torch.Tensor,
                        num_drafts: torch.Tensor, states: torch.Tensor, vocab_size: int,
                        mask: torch.Tensor | None, q_ids: torch.Tensor | None,
                        q_probs: torch.Tensor | None, penalties: PenaltyHistory | None,
                        eos_ids: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Validate; return (logits as [B*(K+1), V_pad], mask as [M, ceil(V/32)] or None) as views.

    Raises ValueError naming the argument for any mismatch (no device values are read)."""
    dev = logits.device
    if drafts.dim() != 2 or drafts.dtype not in (torch.int32, torch.int64) or drafts.device != dev:
        raise ValueError(f"drafts: expected int32/int64 [B, K] on {dev}, got {drafts.dtype} "
                         f"{tuple(drafts.shape)} on {drafts.device}")
    rows, k = drafts.shape
    positions = rows * (k + 1)
    shaped = logits.dim() == 2 or (logits.dim() == 3 and logits.shape[:2] == (rows, k + 1))
    flat = logits.reshape(positions, -1) if logits.dim() == 3 and shaped else logits
    if not shaped or flat.shape[0] != positions or flat.stride(1) != 1:
        raise ValueError(f"logits: expected [{rows}, {k + 1}, V_pad] or [{positions}, V_pad] with "
                         f"a unit column stride, got {tuple(logits.shape)}")
    if not 1 <= vocab_size <= flat.shape[1]:
        raise ValueError(f"vocab_size: expected 1 <= V <= {flat.shape[1]}, got {vocab_size}")
    if params.rows != rows or params.temperature.device != dev:
        raise ValueError(f"params: expected {rows} rows on {dev}, got {params.rows} on "
                         f"{params.temperature.device}")
    if num_drafts.shape != (rows,) or num_drafts.dtype != torch.int32 or num_drafts.device != dev:
        raise ValueError(f"num_drafts: expected int32 [{rows}] on {dev}, got {num_drafts.dtype} "
                         f"{tuple(num_drafts.shape)} on {num_drafts.device}")
    if states.shape != (rows, k + 1) or states.dtype != torch.int32 or states.device != dev:
        raise ValueError(f"states: expected int32 [{rows}, {k + 1}] on {dev}, got {states.dtype} "
                         f"{tuple(states.shape)} on {states.device}")
    if (q_ids is None) != (q_probs is None):
        raise ValueError("q_ids and q_probs: give both (sparse q) or neither (one-hot q)")
    if q_ids is not None and (q_ids.dim() != 3 or q_ids.shape[:2] != (rows, k)
                              or q_ids.shape != q_probs.shape or q_ids.dtype != torch.int32
                              or q_probs.dtype != torch.float32 or q_ids.device != dev
                              or q_probs.device != dev or q_ids.stride(-1) != 1
                              or q_probs.stride(-1) != 1):
        raise ValueError(f"q_ids, q_probs: expected int32 and float32 [{rows}, {k}, Q] on {dev}, "
                         f"got {q_ids.dtype} {tuple(q_ids.shape)} and {q_probs.dtype} "
                         f"{tuple(q_probs.shape)}")
    if penalties is not None and (penalties.ids.shape[0] != positions
                                  or penalties.ids.device != dev):
        raise ValueError(f"penalties: expected {positions} rows (one per position, see "
                         f"speculative_penalties) on {dev}, got {tuple(penalties.ids.shape)}")
    if eos_ids is not None and (eos_ids.dim() != 1 or eos_ids.dtype != torch.int32
                                or eos_ids.device != dev):
        raise ValueError(f"eos_ids: expected int32 [E] on {dev}, got {eos_ids.dtype} "
                         f"{tuple(eos_ids.shape)} on {eos_ids.device}")
    if mask is None:
        return flat, None
    words = mask_words(vocab_size)
    if mask.dim() != 3 or mask.shape[1] != k + 1 or mask.shape[0] < rows \
            or mask.shape[2] != words or mask.dtype != torch.int32 or mask.device != dev:
        raise ValueError(f"mask: expected int32 [>= {rows}, {k + 1}, {words}] on {dev}, got "
                         f"{mask.dtype} {tuple(mask.shape)} on {mask.device}")
    try:
        return flat, mask.view(-1, words)
    except RuntimeError as e:
        raise ValueError(f"mask: leading dimensions must flatten without a copy: {e}") from e


def position_params(params: SamplingParams, positions_per_row: int) -> SamplingParams:
    """The parameters of every logits row (b, i): row b's, at logical position position[b] + i."""
    rep = {name: getattr(params, name).repeat_interleave(positions_per_row)
           for name in params.__dataclass_fields__}
    offset = torch.arange(positions_per_row, device=params.position.device).repeat(params.rows)
    rep["position"] = rep["position"] + offset
    return SamplingParams(**rep)


def mask_rows(states: torch.Tensor) -> torch.Tensor:
    """int32 [B*(K+1)]: the mask row of each READY position (b * (K+1) + i), -1 elsewhere."""
    flat = states.reshape(-1)
    index = torch.arange(flat.shape[0], dtype=torch.int32, device=flat.device)
    return torch.where(flat == PositionState.READY, index, -1).to(torch.int32)


def speculative_penalties(base: PenaltyHistory, drafts: torch.Tensor) -> PenaltyHistory:
    """Per-position penalty history [B*(K+1), L+K]: position i of row b sees row b's committed
    history plus d_0..d_{i-1} as output tokens (design: "The target distribution at position i is
    fixed by committed prefix + draft[0:i]: its grammar state, penalty history and model logits
    use the same hypothetical prefix"). Tokens stay unique per row; on the device, no sync.

    base: [B, L] (L may be 0); drafts: [B, K] non-negative where used."""
    rows, hist = base.ids.shape
    k = drafts.shape[1]
    dev = drafts.device
    d = drafts.to(torch.int32)
    ids_ext = torch.cat([base.ids, d], dim=1)  # [B, L+K]
    counts_ext = torch.cat([base.counts, torch.zeros_like(d)], dim=1)
    first = (d[:, :, None] == ids_ext[:, None, :]).int().argmax(-1)  # [B, K] first equal entry
    before = torch.arange(k, device=dev)[None, :] < torch.arange(k + 1, device=dev)[:, None]
    hits = first[:, :, None] == torch.arange(hist + k, device=dev)  # [B, K, L+K]
    added = torch.einsum("ij,bje->bie", before.float(), hits.float()).round().int()  # [B, K+1, L+K]
    counts = counts_ext[:, None, :] + added
    own = first == hist + torch.arange(k, device=dev)  # [B, K]: first occurrence of its token
    ids = ids_ext[:, None, :].repeat(1, k + 1, 1)  # [B, K+1, L+K]
    ids[:, :, hist:] = torch.where(own[:, None, :] & before[None], d[:, None, :], -1)
    return PenaltyHistory(ids.reshape(rows * (k + 1), hist + k),
                          counts.reshape(rows * (k + 1), hist + k).to(torch.int32))
