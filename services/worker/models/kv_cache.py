"""The key/value cache of a dense decoder: one region per resident lane, allocated once at start.

Layout: one tensor `data: [num_layers, 2, lanes, max_len, num_kv_heads, head_dim]`; `keys(layer)` and
`values(layer)` are views `[lanes, max_len, num_kv_heads, head_dim]`. Token `p` of the request that
occupies lane `l` lives at `[l, p]`. The model writes each forward's keys and values at the given
positions and reads the lane's positions `0..p` for a query at position `p`, so a lane is reused by
simply writing a new request over it from position 0: nothing is ever cleared. It is the dense
model's `ModelState` (models/state.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.worker.models.config import ModelConfig


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass(eq=False)
class KVCache:
    """Per-lane key/value storage; build it with `KVCache.allocate` or `KVCache.from_budget`."""

    data: torch.Tensor  # [num_layers, 2, lanes, max_len, num_kv_heads, head_dim]

    @property
    def num_layers(self) -> int:
        return self.data.shape[0]

    @property
    def lanes(self) -> int:
        return self.data.shape[2]

    @property
    def max_len(self) -> int:
        """Positions each lane holds (a request's prompt plus output must fit)."""
        return self.data.shape[3]

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def keys(self, layer: int) -> torch.Tensor:
        """Keys of one layer: [lanes, max_len, num_kv_heads, head_dim] (a view)."""
        return self.data[layer, 0]

    def values(self, layer: int) -> torch.Tensor:
        """Values of one layer: [lanes, max_len, num_kv_heads, head_dim] (a view)."""
        return self.data[layer, 1]

    def commit(self, lanes: torch.Tensor, kept: torch.Tensor) -> None:
        """Nothing to do: keys and values past the kept positions lie beyond the committed
        frontier and are overwritten before being read (models/state.py)."""

    @staticmethod
    def bytes_per_token(config: ModelConfig, dtype: torch.dtype) -> int:
        """Bytes one cached token costs over all layers (keys and values)."""
        return 2 * config.num_layers * config.num_kv_heads * config.head_dim * _element_size(dtype)

    @staticmethod
    def tokens_for_budget(config: ModelConfig, budget_bytes: int, dtype: torch.dtype) -> int:
        """How many cached tokens (summed over all lanes) fit in `budget_bytes`; 0 if none."""
        if budget_bytes < 0:
            raise ValueError(f"budget_bytes must be >= 0, got {budget_bytes}")
        return budget_bytes // KVCache.bytes_per_token(config, dtype)

    @classmethod
    def allocate(cls, config: ModelConfig, lanes: int, max_len: int, dtype: torch.dtype = torch.float32,
                 device: torch.device | str = "cpu") -> "KVCache":
        """Allocate `lanes` regions of `max_len` positions each, zero-filled. Raises ValueError when
        lanes or max_len is not positive."""
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        if max_len <= 0:
            raise ValueError(f"max_len must be positive, got {max_len}")
        shape = (config.num_layers, 2, lanes, max_len, config.num_kv_heads, config.head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device))

    @classmethod
    def from_budget(cls, config: ModelConfig, lanes: int, budget_bytes: int, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", max_len: int | None = None) -> "KVCache":
        """The longest lanes that fit `budget_bytes`, capped at `max_len` (default: the model's
        max_position_embeddings). Raises ValueError when not even one position per lane fits."""
        if lanes <= 0:
            raise ValueError(f"lanes must be positive, got {lanes}")
        cap = config.max_position_embeddings if max_len is None else max_len
        per_lane = cls.tokens_for_budget(config, budget_bytes, dtype) // lanes
        if per_lane <= 0:
            raise ValueError(
                f"a KV budget of {budget_bytes} bytes holds no position for {lanes} lanes "
                f"({cls.bytes_per_token(config, dtype)} bytes per token)"
            )
        return cls.allocate(config, lanes, min(per_lane, cap), dtype, device)
