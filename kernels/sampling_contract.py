"""What the sampling kernels take and return, shared by the Triton path and the torch reference.

Per logits row n (an ordinary row, or one speculative target position; N rows in all):

- `logits[n, :V]`: the model's values; columns from V up to the physical padding width are never
  read.
- `PenaltyHistory` (optional): the tokens row n has seen, sparse, `ids[n, j]` / `counts[n, j]`
  (int32, `ids == -1` pads; ids unique within a row). `counts` is the number of occurrences in the
  generated output; an entry with count 0 is a token seen only in the prompt. Repetition penalty r
  (HF / vLLM) applies to every listed id: z / r if z > 0 else z * r; then presence p and frequency
  f apply to output tokens: z - p * (count > 0) - f * count.
- The legal mask (optional): packed int32 words `mask[..., ceil(V/32)]`, bit i of word w = token
  32*w + i (lowest bit = smaller id), bits beyond V zero. Any leading layout (`[B, W]`, the
  speculative `[B, K+1, W]`, a lane-indexed Program buffer) is flattened to mask rows, and the row
  descriptor `mask_row[n]` (int32) names the mask row of logits row n, or -1 for an unconstrained
  row whose mask is never read (no all-ones mask is ever materialised). `mask=None` means the whole
  batch is unconstrained and no mask code runs.
- `SamplingParams`: temperature (0 = greedy), top-k (0 = off), top-p, min-p, penalties, and the RNG
  key (seed, logical position); the purpose is one per call (`kernels.rng.Purpose`).

Sampling rule (design document): with penalized logits z and legal set A, the top-k candidates C are
chosen over A (ordered by z descending, ties to the smaller id; fewer than k when A has fewer finite
values). At T > 0 the weights are exp(z_v/T - max_C(z/T)); min-p keeps weights >= min_p * max; top-p
then keeps, in candidate order, each token whose preceding kept mass is < top_p of the kept total;
the rest is normalised to p, and the token is the first in candidate order whose cumulative p
exceeds the uniform u of (seed, position, purpose). T = 0 takes the largest z in A, ties to the
smaller id.

Statuses per row: OK; DEAD_END when A is empty; NONFINITE when a legal value is NaN or +inf, or
every legal value is -inf (no finite candidate). Illegal values are never inspected. A failed row
carries token 0 only as an in-range placeholder and probability 0: the caller must not commit it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import IntEnum

import torch


class SampleStatus(IntEnum):
    """Per-row outcome; anything but OK means the token is a placeholder."""

    OK = 0
    DEAD_END = 1  # the legal set is empty
    NONFINITE = 2  # a legal NaN / +inf, or no finite legal value: a per-row internal failure


_FLOAT_FIELDS = ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")
_DTYPES = {"temperature": torch.float32, "top_k": torch.int32, "top_p": torch.float32,
           "min_p": torch.float32, "repetition_penalty": torch.float32,
           "presence_penalty": torch.float32, "frequency_penalty": torch.float32,
           "seed": torch.int64, "position": torch.int64}


@dataclass(frozen=True)
class SamplingParams:
    """Per-row sampling parameters, each a [N] tensor on the logits' device.

    Shapes and dtypes are checked here (no device sync); value ranges are checked by `from_rows`,
    which builds the tensors on the host."""

    temperature: torch.Tensor  # [N] float32, >= 0; 0 = greedy
    top_k: torch.Tensor  # [N] int32, >= 0; 0 = all legal tokens
    top_p: torch.Tensor  # [N] float32 in (0, 1]; 1 = off
    min_p: torch.Tensor  # [N] float32 in [0, 1]; 0 = off
    repetition_penalty: torch.Tensor  # [N] float32 > 0; 1 = off
    presence_penalty: torch.Tensor  # [N] float32, finite; 0 = off
    frequency_penalty: torch.Tensor  # [N] float32, finite; 0 = off
    seed: torch.Tensor  # [N] int64, the request's RNG seed
    position: torch.Tensor  # [N] int64, the logical output position being sampled

    def __post_init__(self) -> None:
        rows = self.temperature.shape
        device = self.temperature.device
        for f in fields(self):
            t = getattr(self, f.name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1:
                raise ValueError(f"SamplingParams.{f.name} must be a 1-D tensor, got {t!r:.60}")
            if t.shape != rows or t.device != device or t.dtype != _DTYPES[f.name]:
                raise ValueError(
                    f"SamplingParams.{f.name}: expected {_DTYPES[f.name]} "
                    f"{tuple(rows)} on {device}, "
                    f"got {t.dtype} {tuple(t.shape)} on {t.device}"
                )

    @property
    def rows(self) -> int:
        return self.temperature.shape[0]

    @classmethod
    def from_rows(cls, n: int, *, temperature: float | Sequence[float] = 1.0,
                  top_k: int | Sequence[int] = 0, top_p: float | Sequence[float] = 1.0,
                  min_p: float | Sequence[float] = 0.0,
                  repetition_penalty: float | Sequence[float] = 1.0,
                  presence_penalty: float | Sequence[float] = 0.0,
                  frequency_penalty: float | Sequence[float] = 0.0,
                  seed: int | Sequence[int] = 0, position: int | Sequence[int] = 0,
                  device: torch.device | str = "cpu") -> "SamplingParams":
        """Build and range-check N rows from scalars (broadcast) or length-N sequences.

        Defaults: T=1, top_k=0 (off), top_p=1, min_p=0, no penalties, seed=0, position=0.
        Raises ValueError naming the field and row for a wrong length or an out-of-range value."""
        given = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                     repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                     frequency_penalty=frequency_penalty, seed=seed, position=position)
        columns: dict[str, list] = {}
        for name, value in given.items():
            values = list(value) if isinstance(value, Sequence) else [value] * n
            if len(values) != n:
                raise ValueError(f"{name}: expected {n} rows, got {len(values)}")
            for row, v in enumerate(values):
                check_value(name, row, v)
            columns[name] = values
        return cls(**{name: torch.tensor(values, dtype=_DTYPES[name], device=device)
                      for name, values in columns.items()})


def check_value(name: str, row: int, v: float) -> None:
    where = f"{name}[{row}]"
    if name in _FLOAT_FIELDS and not math.isfinite(v):
        raise ValueError(f"{where}: expected a finite number, got {v}")
    ok = {"temperature": v >= 0, "top_k": v >= 0, "top_p": 0 < v <= 1, "min_p": 0 <= v <= 1,
          "repetition_penalty": v > 0, "seed": -2**63 <= v < 2**63,
          "position": 0 <= v < 2**63}.get(name, True)
    if not ok:
        raise ValueError(f"{where}: value {v} is out of range")


@dataclass(frozen=True)
class PenaltyHistory:
    """Sparse token history per row for repetition / presence / frequency penalties."""

    ids: torch.Tensor  # [N, L] int32, token ids, -1 = padding, unique within a row
    counts: torch.Tensor  # [N, L] int32, occurrences in the output (0 = seen in the prompt only)

    def __post_init__(self) -> None:
        if self.ids.dim() != 2 or self.ids.shape != self.counts.shape:
            raise ValueError(f"PenaltyHistory: ids {tuple(self.ids.shape)} and counts "
                             f"{tuple(self.counts.shape)} must be equal [N, L] shapes")
        if self.ids.dtype != torch.int32 or self.counts.dtype != torch.int32:
            raise ValueError(f"PenaltyHistory: expected int32 ids/counts, got {self.ids.dtype}/"
                             f"{self.counts.dtype}")


@dataclass(frozen=True)
class SampleResult:
    """Per-row output of one sampling call."""

    tokens: torch.Tensor  # [N] int64, the chosen id; 0 as a placeholder unless status == OK
    status: torch.Tensor  # [N] int32, SampleStatus values
    prob: (
        torch.Tensor
    )  # [N] float32, final normalised probability of the token (1 greedy, 0 failed)
    uniform: torch.Tensor  # [N] float32, the (seed, position, purpose) uniform this call used


def mask_words(vocab_size: int) -> int:
    """Number of int32 words per mask row: ceil(V / 32)."""
    return (vocab_size + 31) // 32


def check_inputs(logits: torch.Tensor, params: SamplingParams, vocab_size: int,
                 mask: torch.Tensor | None, mask_row: torch.Tensor | None,
                 penalties: PenaltyHistory | None) -> torch.Tensor | None:
    """Validate shapes, dtypes and devices; return the mask flattened to [M, ceil(V/32)] (a view).

    Raises ValueError naming the argument for any mismatch."""
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(f"logits: expected [N, V_pad] with unit column stride, got "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    n, width = logits.shape
    if not 1 <= vocab_size <= width or vocab_size >= 2**31 - 1:
        raise ValueError(f"vocab_size: expected 1 <= V <= {width} (logits width), got {vocab_size}")
    if params.rows != n or params.temperature.device != logits.device:
        raise ValueError(f"params: expected {n} rows on {logits.device}, got {params.rows} on "
                         f"{params.temperature.device}")
    if penalties is not None and (penalties.ids.shape[0] != n
                                  or penalties.ids.device != logits.device):
        raise ValueError(f"penalties: expected {n} rows on {logits.device}, got "
                         f"{tuple(penalties.ids.shape)} on {penalties.ids.device}")
    if mask is None:
        if mask_row is not None:
            raise ValueError("mask_row was given without a mask")
        return None
    words = mask_words(vocab_size)
    if mask.dtype != torch.int32 or mask.dim() < 2 or mask.shape[-1] != words \
            or mask.device != logits.device:
        raise ValueError(
            f"mask: expected int32 [..., {words}] on {logits.device}, got {mask.dtype} "
            f"{tuple(mask.shape)} on {mask.device}"
        )
    if mask_row is None or mask_row.shape != (n,) or mask_row.dtype != torch.int32 \
            or mask_row.device != logits.device:
        raise ValueError(f"mask_row: expected int32 [{n}] on {logits.device} with a mask, got "
                         f"{None if mask_row is None else (mask_row.dtype, tuple(mask_row.shape))}")
    try:
        return mask.view(-1, words)  # [M, W], no copy: rows index the caller's buffer
    except RuntimeError as e:
        raise ValueError(f"mask: leading dimensions must flatten without a copy: {e}") from e
