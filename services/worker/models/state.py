"""Per-lane model state: what a model allocates once at start and how a step's state is kept.

Every model the worker serves exposes the same three calls; the Program never builds state itself:

    model.max_len_for_budget(lanes, budget_bytes, dtype) -> int   longest lanes a budget allows
    state = model.new_state(lanes, max_len, dtype=, device=)      allocated once, zero-filled
    model(tokens, positions, state, lanes, kv_len=, logit_index=, num_tokens=) -> logits
    state.commit(lanes, kept)                                     after a step's forward

A forward writes this step's state for its rows; `commit` keeps, for row b, the state after its
first `kept[b]` fed tokens (all of them in ordinary decoding, the anchor and the accepted drafts
when verifying). For a dense model the KV of later positions lies beyond the committed frontier
and is overwritten before anything reads it, so its commit has nothing to do; a hybrid model
(recurrent state) selects the kept position's snapshot there. A step whose commit is never called
(a cancelled row, an aborted round) must leave the committed state as it was.
"""

from __future__ import annotations

from typing import Protocol

import torch


class ModelState(Protocol):
    @property
    def lanes(self) -> int:
        """Lanes allocated (the Program's resident lanes plus a scratch lane with graphs)."""

    @property
    def max_len(self) -> int:
        """Positions each lane holds: a request's prompt plus output must fit."""

    @property
    def nbytes(self) -> int:
        """Device bytes the state occupies."""

    def commit(self, lanes: torch.Tensor, kept: torch.Tensor) -> None:
        """lanes: [n] int64; kept: [n] int64, 1 <= kept[b] <= tokens row b fed this step."""
