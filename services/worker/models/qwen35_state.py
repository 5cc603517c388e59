"""Per-lane state of a Qwen3.5 model, allocated once: attention KV, GDN conv windows and recurrent
states, and what committing a speculative verification needs.

Layout (G GDN layers, A attention layers plus the MTP layer's when the model has one):

- `kv: [A, 2, lanes, max_len, Hkv, D]`: as models/kv_cache.py, token p of lane l at [l, p]; a
  verification's rejected positions are simply overwritten later (positions mask attention).
- `ssm: [G, lanes * slots, Hv, dk, dv]` float32 and `conv: [G, lanes * slots, C, K-1]` (model dtype):
  `slots` is 1 without speculation; with `verify_width` W > 0 it is 2 and `slot[lane]` names the live
  one. Every forward reads the live slot and writes the other (then flips), so the state before the
  last forward survives it.
- Replay buffers (W > 0): the last forward's per-token GDN inputs, `x` (conv input), `y` (conv
  output), `a`, `b` (raw gate projections), W tokens per lane and layer.

`commit(lanes, accepted)` after a verification forward of T <= W tokens keeps, per row, the state
after its first accepted[b] tokens: rows that accepted all T keep the forward's result; the others
replay accepted[b] recurrence steps from the surviving pre-forward slot (no output, no projection,
no recomputation of the prompt) and rebuild the conv window from the recorded inputs. The cost of
this scheme over per-position snapshots, at the 9B shape (24 GDN layers, 32 x 128 x 128 float32
state, conv 8192 x 3 bf16), B = 64 lanes, K = 15 (W = 16):

    second slot: 24 x (2 MiB + 48 KiB) = 49 MiB/lane;  replay buffers: 24 x 16 x 32 KiB = 12 MiB/lane
    -> 61 MiB/lane, 3.8 GiB for 64 lanes (snapshots: 16 x 49 MiB = 784 MiB/lane, 49 GiB)

(`speculation_bytes_per_lane` computes it.) A lane is reused by a new request without clearing:
a forward row whose first position is 0 starts from a zero recurrent state and conv window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import gdn_ref
from services.worker.models.gdn import step
from services.worker.models.qwen35_config import Qwen35Config


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(frozen=True)
class StepIndex:
    """Where one forward reads and writes each row's GDN state (device tensors, no host sync)."""

    lanes: torch.Tensor  # [B] int64
    src: torch.Tensor  # [B] int64 rows of ssm[layer] / conv[layer] to read
    dst: torch.Tensor  # [B] int64 rows to write
    reset: torch.Tensor  # [B] int32: 1 where the row starts a sequence (position 0)
    counts: torch.Tensor  # [B] int64 real tokens per row
    valid: torch.Tensor  # [B, T] bool: token t of row b is real
    record: bool  # T <= verify_width: the replay buffers take this forward's inputs


class Qwen35State:
    """The state of `lanes` lanes of `max_len` positions; build with `Qwen35State.allocate`."""

    def __init__(self, config: Qwen35Config, lanes: int, max_len: int, *, dtype: torch.dtype,
                 device: torch.device | str, verify_width: int = 0, mtp: bool = False,
                 gates: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """`gates`: each GDN layer's (A_log, dt_bias), which `commit` needs to replay (the model's
        `new_state` passes them); required when verify_width > 0."""
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if verify_width < 0:
            raise ValueError(f"verify_width must be >= 0, got {verify_width}")
        if verify_width and (gates is None or len(gates) != len(config.gdn_layers)):
            raise ValueError("gates: verify_width > 0 needs (A_log, dt_bias) of every GDN layer")
        self._gates = list(gates or ())
        c = config
        self.config = c
        self.verify_width = verify_width
        self.slots = 2 if verify_width else 1
        kw = {"device": device}
        G, n = len(c.gdn_layers), lanes * self.slots
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        self.kv = torch.zeros(len(c.attention_layers) + int(mtp), 2, lanes, max_len, c.num_kv_heads, c.head_dim,
                              dtype=dtype, **kw)
        self.ssm = torch.zeros(G, n, hv, dk, dv, dtype=torch.float32, **kw)
        self.conv = torch.zeros(G, n, c.conv_dim, c.linear_conv_kernel_dim - 1, dtype=dtype, **kw)
        self.slot = torch.zeros(lanes, dtype=torch.int64, **kw)  # [lanes] live slot
        self.last_len = torch.zeros(lanes, dtype=torch.int64, **kw)  # [lanes] tokens of the last forward
        self.last_reset = torch.zeros(lanes, dtype=torch.int32, **kw)  # [lanes] it started a sequence
        W = verify_width
        self.rx = torch.zeros(G, lanes, W, c.conv_dim, dtype=dtype, **kw)  # conv inputs
        self.ry = torch.zeros(G, lanes, W, c.conv_dim, dtype=dtype, **kw)  # conv outputs [q | k | v]
        self.ra = torch.zeros(G, lanes, W, hv, dtype=dtype, **kw)  # raw in_proj_a
        self.rb = torch.zeros(G, lanes, W, hv, dtype=dtype, **kw)  # raw in_proj_b
        self.mtp_layer = len(c.attention_layers) if mtp else None  # kv index of the MTP layer
        self._last_width = 0  # T of the last forward (host side; checked on CPU only)

    @classmethod
    def allocate(cls, config: Qwen35Config, lanes: int, max_len: int, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu", verify_width: int = 0, mtp: bool = False,
                 gates: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> "Qwen35State":
        """Zero-filled state (see the constructor). Raises ValueError for non-positive sizes."""
        return cls(config, lanes, max_len, dtype=dtype, device=device, verify_width=verify_width, mtp=mtp,
                   gates=gates)

    # ---------------------------------------------------------------- sizes

    @property
    def lanes(self) -> int:
        return self.kv.shape[2]

    @property
    def max_len(self) -> int:
        """Positions each lane holds (a request's prompt plus output must fit)."""
        return self.kv.shape[3]

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors())

    def _tensors(self) -> tuple[torch.Tensor, ...]:
        return (self.kv, self.ssm, self.conv, self.slot, self.last_len, self.last_reset, self.rx, self.ry,
                self.ra, self.rb)

    @staticmethod
    def bytes_per_token(config: Qwen35Config, dtype: torch.dtype, *, mtp: bool = False) -> int:
        """Bytes one cached position costs over all attention layers (keys and values)."""
        layers = len(config.attention_layers) + int(mtp)
        return 2 * layers * config.num_kv_heads * config.head_dim * _element_size(dtype)

    @staticmethod
    def bytes_per_lane(config: Qwen35Config, dtype: torch.dtype, *, verify_width: int = 0) -> int:
        """Fixed bytes of one lane, whatever its length: recurrent states, conv windows, replay."""
        c, slots, W = config, 2 if verify_width else 1, verify_width
        G, e = len(c.gdn_layers), _element_size(dtype)
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        state = slots * G * (hv * dk * dv * 4 + c.conv_dim * (c.linear_conv_kernel_dim - 1) * e)
        replay = G * W * (2 * c.conv_dim + 2 * hv) * e
        return state + replay + 8 + 8 + 4

    @staticmethod
    def speculation_bytes_per_lane(config: Qwen35Config, dtype: torch.dtype, verify_width: int) -> int:
        """What verification of up to `verify_width` tokens adds per lane (second slot + replay)."""
        return Qwen35State.bytes_per_lane(config, dtype, verify_width=verify_width) - \
            Qwen35State.bytes_per_lane(config, dtype)

    @classmethod
    def max_len_for_budget(cls, config: Qwen35Config, lanes: int, budget_bytes: int, dtype: torch.dtype, *,
                           verify_width: int = 0, mtp: bool = False) -> int:
        """The longest lanes (positions) that `lanes` lanes fit in `budget_bytes`; 0 if none."""
        if lanes <= 0 or budget_bytes < 0:
            raise ValueError(f"lanes must be positive and budget_bytes >= 0, got {lanes}, {budget_bytes}")
        free = budget_bytes - lanes * cls.bytes_per_lane(config, dtype, verify_width=verify_width)
        return max(free, 0) // (lanes * cls.bytes_per_token(config, dtype, mtp=mtp))

    @classmethod
    def from_budget(cls, config: Qwen35Config, lanes: int, budget_bytes: int, *, dtype: torch.dtype,
                    device: torch.device | str, max_len: int | None = None, verify_width: int = 0,
                    mtp: bool = False, gates: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None
                    ) -> "Qwen35State":
        """The longest lanes that fit `budget_bytes`, capped at `max_len` (default: the model's
        max_position_embeddings). Raises ValueError when not even one position per lane fits."""
        n = cls.max_len_for_budget(config, lanes, budget_bytes, dtype, verify_width=verify_width, mtp=mtp)
        if n <= 0:
            raise ValueError(f"a state budget of {budget_bytes} bytes holds no position for {lanes} lanes "
                             f"({cls.bytes_per_lane(config, dtype, verify_width=verify_width)} bytes per lane + "
                             f"{cls.bytes_per_token(config, dtype, mtp=mtp)} per token)")
        cap = config.max_position_embeddings if max_len is None else max_len
        return cls(config, lanes, min(n, cap), dtype=dtype, device=device, verify_width=verify_width, mtp=mtp,
                   gates=gates)

    # ---------------------------------------------------------------- views

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of attention layer ordinal `layer`: [lanes, max_len, Hkv, D] (a view)."""
        return self.kv[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        return self.kv[layer, 1]

    # ---------------------------------------------------------------- one forward

    def begin(self, lanes: torch.Tensor, positions: torch.Tensor, num_tokens: torch.Tensor | None) -> StepIndex:
        """Index one forward of tokens [B, T] at `positions` for rows in `lanes`; `num_tokens` [B]
        real tokens per row (None: all T)."""
        B, T = positions.shape
        arange = torch.arange(T, device=positions.device)
        counts = torch.full((B,), T, dtype=torch.int64, device=positions.device) if num_tokens is None \
            else num_tokens.to(torch.int64)
        live = self.slot[lanes]  # [B]
        self._last_width = T
        return StepIndex(
            lanes=lanes, src=lanes * self.slots + live, dst=lanes * self.slots + (live + 1) % self.slots,
            reset=(positions[:, 0] == 0).to(torch.int32), counts=counts, valid=arange[None, :] < counts[:, None],
            record=0 < T <= self.verify_width)

    def end(self, step: StepIndex) -> None:
        """Make the forward's writes live (flip the rows' slots) and remember it for `commit`."""
        self.slot[step.lanes] = step.dst - step.lanes * self.slots
        self.last_len[step.lanes] = step.counts
        self.last_reset[step.lanes] = step.reset

    def record(self, layer: int, lanes: torch.Tensor, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor,
               b: torch.Tensor) -> None:
        """Keep GDN layer `layer`'s inputs of this forward (T <= verify_width tokens) for commit:
        x, y: [B, T, C] conv input and output; a, b: [B, T, Hv] raw gate projections."""
        T = x.shape[1]
        self.rx[layer, lanes, :T] = x
        self.ry[layer, lanes, :T] = y
        self.ra[layer, lanes, :T] = a
        self.rb[layer, lanes, :T] = b

    # ---------------------------------------------------------------- commit

    def commit(self, lanes: torch.Tensor | Sequence[int], accepted: torch.Tensor | Sequence[int]) -> None:
        """Keep, for row b, the state after the first accepted[b] tokens of the last forward of
        lanes[b] (1 <= accepted[b] <= that forward's tokens, which were at most verify_width).

        lanes, accepted: [B] int64 (device tensors or host sequences). Without verify_width this is a
        no-op (nothing can be rolled back). Raises ValueError, on the CPU, for an accepted count
        the last forward cannot roll back to. No host synchronisation on CUDA."""
        if self.slots == 1:
            return
        lanes = torch.as_tensor(lanes, dtype=torch.int64, device=self.device)
        accepted = torch.as_tensor(accepted, dtype=torch.int64, device=self.device)
        if self.device.type == "cpu":
            last = self.last_len[lanes]
            if bool((accepted < 1).any() or (accepted > last).any()):
                raise ValueError(f"accepted: expected 1..{last.tolist()}, got {accepted.tolist()}")
            if self._last_width > self.verify_width and bool((accepted != last).any()):
                raise ValueError(f"accepted: the last forward ({self._last_width} tokens) was wider than "
                                 f"verify_width={self.verify_width} and cannot be rolled back")
        live = self.slot[lanes]
        src, dst = lanes * 2 + (1 - live), lanes * 2 + live
        skip = (accepted == self.last_len[lanes]).to(torch.int32)  # [B] nothing to roll back
        reset = self.last_reset[lanes]
        k_taps = self.config.linear_conv_kernel_dim - 1
        kw = {"num_k_heads": self.config.linear_num_key_heads, "key_dim": self.config.linear_key_head_dim,
              "want_out": False}
        for i, (A_log, dt_bias) in enumerate(self._gates):
            # the recurrence over the first accepted tokens, from the pre-forward slot
            step(self.ry[i, lanes], self.ra[i, lanes], self.rb[i, lanes], A_log, dt_bias, self.ssm[i], src, dst,
                 reset, accepted, skip, **kw)
            before = torch.where(reset[:, None, None] != 0, 0, self.conv[i, src])  # [B, C, K-1]
            stream = torch.cat((before, self.rx[i, lanes].transpose(1, 2)), dim=2)  # [B, C, K-1+W]
            window = gdn_ref.window_after(stream, accepted, k_taps)
            self.conv[i, dst] = torch.where(skip[:, None, None] != 0, self.conv[i, dst], window)
        self.last_len[lanes] = accepted
