"""Per-lane state of a Qwen3.5 model, allocated once: attention KV, GDN conv windows and recurrent
states, and what committing a step (a verification included) needs.

The contract (models/state.py): a forward writes this step's state for its rows; `commit(lanes,
kept)` keeps, for row b, the state after its first kept[b] fed tokens; a step whose commit is never
called leaves the committed state as it was. Layout (G GDN layers, A attention layers plus the
MTP layer's when the model has one):

- `kv`: the paged KV of the A attention layers (models/kv_cache.py: blocks and a table per lane);
  what a step writes past the kept positions lies beyond the committed frontier and is
  overwritten before anything reads it.
- `ssm: [G, 2 * lanes, Hv, dk, dv]` float32 and `conv: [G, 2 * lanes, C, K-1]` (model dtype): two
  slots per lane, `slot[lane]` the committed one. A forward reads the committed slot and writes the
  other; commit makes that one committed (flips), so an uncommitted step changes nothing.
- Replay buffers (verify_width W > 0): a forward of 1 < T <= W tokens also records its per-token
  GDN inputs, `x` (conv input), `y` (conv output), `a`, `b` (raw gate projections).

Committing kept[b] < T tokens (a verification that rejected drafts) replays kept[b] recurrence
steps from the committed slot into the pending one, from the recorded inputs (no output, no
projection, no recomputation of the prompt), and rebuilds the conv window; rows that keep all T
tokens only flip. On CUDA that is two kernel launches for all layers. The cost over one slot, at
the 9B shape (24 GDN layers, 32 x 128 x 128 float32 state, conv 8192 x 3 bf16), K = 15 (W = 16):

    second slot: 24 x (2 MiB + 48 KiB) = 49 MiB/lane;
    replay buffers: 24 x 16 x 32 KiB = 12 MiB/lane
    -> 61 MiB/lane, 3.8 GiB for 64 lanes
    (per-position snapshots: 16 x 49 MiB = 784 MiB/lane, 49 GiB)

(`speculation_bytes_per_lane` computes it; the second slot is also what lets an uncommitted step
leave no trace.) A lane is reused by a new request without clearing: a forward row whose first
position is 0 starts from a zero recurrent state and conv window. The prefix cache's snapshots of
the recurrent state live in models/qwen35_snapshots.py (`snapshots`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kernels import gdn_ref
from services.worker.models.kv_cache import KVCache, element_size, positions_for_budget
from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.qwen35_snapshots import Cuts, Snapshots


@dataclass(frozen=True)
class StepIndex:
    """Where one forward reads and writes each row's GDN state (device tensors, no host sync)."""

    lanes: torch.Tensor  # [B] int64
    src: torch.Tensor  # [B] int64 rows of ssm[layer] / conv[layer] to read (the committed slot)
    dst: torch.Tensor  # [B] int64 rows to write (the pending slot)
    reset: torch.Tensor  # [B] int32: 1 where the row starts a sequence (position 0)
    counts: torch.Tensor  # [B] int64 real tokens per row
    record: bool  # 1 < T <= verify_width: the replay buffers take this forward's inputs
    cuts: Cuts | None = None  # prefix-cache snapshots taken inside this forward


class Qwen35State:
    """The state of `lanes` lanes of `max_len` positions (see the module docstring).

    `gates`: each GDN layer's (A_log, dt_bias), which `commit` needs to replay (the model's
    `new_state` passes them); required when verify_width > 0. Raises ValueError for non-positive
    sizes or missing gates."""

    def __init__(self, config: Qwen35Config, lanes: int, max_len: int, *, dtype: torch.dtype,
                 device: torch.device | str, verify_width: int = 0, mtp: bool = False,
                 gates: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
                 num_blocks: int | None = None) -> None:
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        if verify_width < 0:
            raise ValueError(f"verify_width must be >= 0, got {verify_width}")
        c = config
        G = len(c.gdn_layers)
        if verify_width and (gates is None or len(gates) != G):
            raise ValueError("gates: verify_width > 0 needs (A_log, dt_bias) of every GDN layer")
        self.config = c
        self.verify_width = verify_width
        kw = {"device": device}
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        self.kv = KVCache.create(
            len(c.attention_layers) + int(mtp),
            c.num_kv_heads,
            c.head_dim,
            lanes,
            max_len,
            dtype=dtype,
            device=device,
            num_blocks=num_blocks,
        )
        self.ssm = torch.zeros(G, 2 * lanes, hv, dk, dv, dtype=torch.float32, **kw)
        self.conv = torch.zeros(
            G, 2 * lanes, c.conv_dim, c.linear_conv_kernel_dim - 1, dtype=dtype, **kw
        )
        self.slot = torch.zeros(lanes, dtype=torch.int64, **kw)  # [lanes] the committed slot
        self.pending = torch.zeros(
            lanes, dtype=torch.int32, **kw
        )  # [lanes] a forward awaits commit
        self.last_len = torch.zeros(
            lanes, dtype=torch.int64, **kw
        )  # [lanes] tokens of the last forward
        self.last_reset = torch.zeros(
            lanes, dtype=torch.int32, **kw
        )  # [lanes] it started a sequence
        W = verify_width
        self.rx = torch.zeros(G, lanes, W, c.conv_dim, dtype=dtype, **kw)  # conv inputs
        self.ry = torch.zeros(
            G, lanes, W, c.conv_dim, dtype=dtype, **kw
        )  # conv outputs [q | k | v]
        self.ra = torch.zeros(G, lanes, W, hv, dtype=dtype, **kw)  # raw in_proj_a
        self.rb = torch.zeros(G, lanes, W, hv, dtype=dtype, **kw)  # raw in_proj_b
        if gates:
            self.A_log = torch.stack([a.detach().float() for a, _ in gates]).to(device)  # [G, Hv]
            self.dt_bias = torch.stack([d.detach().float() for _, d in gates]).to(device)  # [G, Hv]
        self.mtp_layer = len(c.attention_layers) if mtp else None  # kv index of the MTP layer
        self.snapshots = Snapshots()  # prefix-cache snapshots (allocate_snapshots)
        self._last_width = 0  # T of the last forward (host side; checked on CPU only)

    @classmethod
    def allocate(
        cls,
        config: Qwen35Config,
        lanes: int,
        max_len: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        verify_width: int = 0,
        mtp: bool = False,
        gates: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None,
    ) -> "Qwen35State":
        """Zero-filled state (see the class docstring)."""
        return cls(
            config,
            lanes,
            max_len,
            dtype=dtype,
            device=device,
            verify_width=verify_width,
            mtp=mtp,
            gates=gates,
        )

    # ---------------------------------------------------------------- sizes

    @property
    def lanes(self) -> int:
        return self.kv.lanes

    @property
    def max_len(self) -> int:
        """Positions each lane holds (a request's prompt plus output must fit)."""
        return self.kv.max_len

    @property
    def device(self) -> torch.device:
        return self.kv.device

    @property
    def dtype(self) -> torch.dtype:
        return self.kv.dtype

    @property
    def nbytes(self) -> int:
        tensors = (
            *self.snapshots.tensors,
            self.ssm,
            self.conv,
            self.slot,
            self.pending,
            self.last_len,
            self.last_reset,
            self.rx,
            self.ry,
            self.ra,
            self.rb,
        )
        return self.kv.nbytes + sum(t.numel() * t.element_size() for t in tensors)

    @staticmethod
    def bytes_per_token(config: Qwen35Config, dtype: torch.dtype, *, mtp: bool = False) -> int:
        """Bytes one cached position costs over all attention layers (keys and values)."""
        layers = len(config.attention_layers) + int(mtp)
        return 2 * layers * config.num_kv_heads * config.head_dim * element_size(dtype)

    @staticmethod
    def bytes_per_lane(config: Qwen35Config, dtype: torch.dtype, *, verify_width: int = 0) -> int:
        """Fixed bytes of one lane, whatever its length: recurrent states and conv windows (two
        slots), replay buffers, bookkeeping."""
        c, W = config, verify_width
        G, e = len(c.gdn_layers), element_size(dtype)
        hv, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        state = 2 * G * (hv * dk * dv * 4 + c.conv_dim * (c.linear_conv_kernel_dim - 1) * e)
        replay = G * W * (2 * c.conv_dim + 2 * hv) * e
        return state + replay + 8 + 4 + 8 + 4

    @staticmethod
    def speculation_bytes_per_lane(
        config: Qwen35Config, dtype: torch.dtype, verify_width: int
    ) -> int:
        """What verifying up to `verify_width` tokens costs per lane over a single-slot state
        without replay buffers (the second slot plus the replay buffers)."""
        c = config
        G, e = len(c.gdn_layers), element_size(dtype)
        one_slot = G * (
            c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
            + c.conv_dim * (c.linear_conv_kernel_dim - 1) * e
        )
        return one_slot + G * verify_width * (2 * c.conv_dim + 2 * c.linear_num_value_heads) * e

    @classmethod
    def max_len_for_budget(
        cls,
        config: Qwen35Config,
        lanes: int,
        budget_bytes: int,
        dtype: torch.dtype,
        *,
        verify_width: int = 0,
        mtp: bool = False,
    ) -> int:
        """The longest lanes (positions, whole KV blocks) that `lanes` lanes fit in
        `budget_bytes`; 0 if none."""
        if lanes <= 0 or budget_bytes < 0:
            raise ValueError(
                f"lanes must be positive and budget_bytes >= 0, got {lanes}, {budget_bytes}"
            )
        free = budget_bytes - lanes * cls.bytes_per_lane(config, dtype, verify_width=verify_width)
        return positions_for_budget(
            cls.bytes_per_token(config, dtype, mtp=mtp), lanes, max(free, 0)
        )

    # ---------------------------------------------------------------- views

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of attention layer ordinal `layer`: [num_blocks, block_size, Hkv, D] (a view)."""
        return self.kv.keys(layer)

    def values(self, layer: int) -> torch.Tensor:
        return self.kv.values(layer)

    # ---------------------------------------------------------------- prefix-cache snapshots

    @property
    def snap_ssm(self) -> torch.Tensor | None:
        return self.snapshots.ssm

    @property
    def snap_conv(self) -> torch.Tensor | None:
        return self.snapshots.conv

    def allocate_snapshots(self, count: int) -> None:
        """`count` snapshot slots (models/qwen35_snapshots.py) of this state's recurrent state."""
        self.snapshots.allocate(count, self.ssm, self.conv)

    @staticmethod
    def bytes_per_snapshot(config: Qwen35Config, dtype: torch.dtype) -> int:
        return Snapshots.bytes_per_slot(config, dtype)

    def cut_next(self, cuts) -> None:
        """Where the next forward snapshots its rows' recurrent state (`Snapshots.cut_next`)."""
        self.snapshots.cut_next(cuts)

    def save_pending(self, lanes: torch.Tensor, slots: torch.Tensor) -> None:
        """Snapshot the state the last forward of `lanes` ([n] int64) left uncommitted into
        snapshot slots `slots` ([n] int64): a prefill forward split at its cuts
        (program/prefill_graphs.py `run_segments`) takes its snapshots between segments."""
        self.snapshots.save(self.ssm, self.conv, 2 * lanes + 1 - self.slot[lanes], slots)

    def count_whole(self, lanes: torch.Tensor, counts: torch.Tensor) -> None:
        """The pending forward of `lanes` counts as one of `counts` tokens (the last segment of a
        forward split at its cuts, whose earlier segments are committed): committing that many
        keeps it whole."""
        self.last_len[lanes] = counts

    def load_snapshot(self, lane: int, slot: int) -> None:
        """Make snapshot `slot` `lane`'s committed recurrent state (a lane about to resume at the
        snapshot's boundary: its next forward starts there, not at position 0)."""
        row = (2 * lane + self.slot[lane]).view(1)
        self.snapshots.restore(self.ssm, self.conv, row, slot)

    # ---------------------------------------------------------------- one forward

    def begin(
        self, lanes: torch.Tensor, positions: torch.Tensor, num_tokens: torch.Tensor | None
    ) -> StepIndex:
        """Index one forward of tokens [B, T] at `positions` for rows in `lanes`; `num_tokens` [B]
        real tokens per row (None: all T)."""
        B, T = positions.shape
        counts = (
            torch.full((B,), T, dtype=torch.int64, device=positions.device)
            if num_tokens is None
            else num_tokens.to(torch.int64)
        )
        live = self.slot[lanes]  # [B]
        self._last_width = T
        return StepIndex(lanes=lanes, src=2 * lanes + live, dst=2 * lanes + 1 - live,
                         reset=(positions[:, 0] == 0).to(torch.int32), counts=counts,
                         record=1 < T <= self.verify_width,  # a 1-token step is kept whole
                         cuts=self.snapshots.take(self.device))

    def record(
        self,
        layer: int,
        lanes: torch.Tensor,
        x: torch.Tensor,
        y: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
    ) -> None:
        """Keep GDN layer `layer`'s inputs of this forward (T <= verify_width tokens) for commit:
        x, y: [B, T, C] conv input and output; a, b: [B, T, Hv] raw gate projections."""
        T = x.shape[1]
        self.rx[layer, lanes, :T] = x
        self.ry[layer, lanes, :T] = y
        self.ra[layer, lanes, :T] = a
        self.rb[layer, lanes, :T] = b

    def end(self, step: StepIndex) -> None:
        """The forward's writes await `commit` (nothing committed changes)."""
        # index_fill_ with a Python scalar: `pending[lanes] = 1` would copy a CPU scalar tensor,
        # which a CUDA graph capture refuses.
        self.pending.index_fill_(0, step.lanes, 1)
        self.last_len[step.lanes] = step.counts
        self.last_reset[step.lanes] = step.reset

    # ---------------------------------------------------------------- commit

    def commit(
        self, lanes: torch.Tensor | Sequence[int], kept: torch.Tensor | Sequence[int]
    ) -> None:
        """Keep, for row b, the state after the first kept[b] tokens of the last forward of
        lanes[b] (1 <= kept[b] <= the tokens it fed; fewer than all only after a forward of at most
        verify_width tokens). A lane with no forward since its last commit is left as it is.

        lanes, kept: [B] int64 (device tensors or host sequences), lanes distinct. Raises
        ValueError, on the CPU, for a count the last forward cannot be committed at. No host
        synchronisation on CUDA."""
        lanes = torch.as_tensor(lanes, dtype=torch.int64, device=self.device)
        kept = torch.as_tensor(kept, dtype=torch.int64, device=self.device)
        last = self.last_len[lanes]
        if self.device.type == "cpu":
            if bool((kept < 1).any() or (kept > last).any()):
                raise ValueError(f"kept: expected 1..{last.tolist()}, got {kept.tolist()}")
            partial = bool((kept != last).any())
            if partial and not 0 < self._last_width <= self.verify_width:
                raise ValueError(
                    f"kept: the last forward ({self._last_width} tokens) is wider than "
                    f"verify_width={self.verify_width} and can only be committed whole"
                )
        pending = self.pending[lanes]  # [B]
        live = self.slot[lanes]
        if self.verify_width:
            src, dst = 2 * lanes + live, 2 * lanes + 1 - live
            skip = ((kept == last) | (pending == 0)).to(torch.int32)  # [B] nothing to replay
            self._replay(lanes, src, dst, self.last_reset[lanes], kept, skip)
        self.slot[lanes] = torch.where(pending != 0, 1 - live, live)
        self.last_len[lanes] = torch.where(pending != 0, kept, last)
        self.pending.index_fill_(0, lanes, 0)

    def _replay(self, lanes, src, dst, reset, kept, skip) -> None:
        # The pending slot of a row that keeps fewer tokens than it fed: the recurrence over its
        # first kept tokens from the committed slot, and the conv window after them.
        heads = {
            "num_k_heads": self.config.linear_num_key_heads,
            "key_dim": self.config.linear_key_head_dim,
        }
        if self.device.type == "cuda":  # the Triton pair; their torch references elsewhere
            from kernels.conv import commit_windows
            from kernels.gdn import gdn_replay
        else:
            commit_windows, gdn_replay = gdn_ref.commit_windows_ref, gdn_ref.gdn_replay_ref
        gdn_replay(self.ry, self.ra, self.rb, lanes, self.A_log, self.dt_bias, self.ssm, src, dst,
                   reset, kept, skip, **heads)
        commit_windows(self.conv, self.rx, lanes, src, dst, reset, kept, skip)
