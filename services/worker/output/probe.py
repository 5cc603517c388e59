"""A probe: a temporary walk from a session's committed matcher, for proposers (grammar drafts).

It is the lookahead's transaction without the masks: tokens accepted through it are temporary and
`close()` rolls every one of them back (with the tool grammar's parameter-name companion), so the
committed matcher is exactly where it was. It never previews, confirms or publishes, and a session
takes no lookahead or preview while it is open (the OutputSession checks).
"""

from __future__ import annotations

import torch

from services.worker.output.named_matcher import NamedMatcher
from shared.errors import InternalError


class MatcherProbe:
    """`forced_bytes()`, `accept(token)`, `rollback(n)`, `terminated`, `may_end`, `legal_ids()`
    over a session's matcher;
    `close()` (or leaving the `with` block) rolls back what was accepted."""

    def __init__(self, matcher: NamedMatcher, domain, on_close) -> None:
        self._m = matcher  # with the parameter-name companion, if any
        self.domain = domain
        self._on_close = on_close
        self._accepted = 0
        self._scratch: torch.Tensor | None = None

    def forced_bytes(self) -> bytes:
        """The bytes the grammar forces after the committed output and the accepted tokens."""
        return b"" if self._m.is_terminated() else self._m.forced_bytes()

    def accept(self, token: int) -> bool:
        """Accept `token` temporarily; False (nothing changes) when the grammar refuses it."""
        if self._m.is_terminated() or not self._m.accept_token(int(token)):
            return False
        self._accepted += 1
        return True

    def rollback(self, n: int) -> None:
        """Undo the last n tokens accepted through the probe (InternalError past its start)."""
        if not 0 <= n <= self._accepted:
            raise InternalError(f"probe rollback({n}) with {self._accepted} accepted")
        if n:
            self._m.rollback(n)
            self._accepted -= n

    @property
    def terminated(self) -> bool:
        return self._m.is_terminated()

    @property
    def may_end(self) -> bool:
        return self._m.is_completed()

    def legal_ids(self, limit: int = 2) -> list[int]:
        """Up to `limit` legal next token ids, smallest first (the mask of the current state)."""
        if self._m.is_terminated():
            return []
        if self._scratch is None:
            self._scratch = torch.empty((1, self.domain.mask_words), dtype=torch.int32)
        row = self._scratch
        self._m.fill_mask(row, 0)
        words = torch.nonzero(row[0]).flatten().tolist()
        out: list[int] = []
        for w in words:
            bits = int(row[0, w]) & 0xFFFFFFFF
            while bits and len(out) < limit:
                low = bits & -bits
                out.append(32 * w + low.bit_length() - 1)
                bits ^= low
            if len(out) >= limit:
                break
        return out

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        try:
            self.rollback(self._accepted)
        finally:  # a matcher that raised still releases the session (its next fill reports it)
            if on_close is not None:
                on_close()

    def __enter__(self) -> "MatcherProbe":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
