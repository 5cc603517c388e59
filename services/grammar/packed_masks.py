"""Reading and clearing token bits of a packed mask row (32 tokens a word, token t at bit t % 32
of word t // 32: xgrammar's and llguidance's layout), for the companions that edit a matcher's
mask beside it."""

from __future__ import annotations

import numpy as np


def set_bits(words: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Which of `ids` are set in the packed row `words` (int32 or uint32): bool per id."""
    return ((words[ids >> 5].view(np.uint32) >> (ids & 31).astype(np.uint32)) & 1).astype(bool)


def clear_bits(words: np.ndarray, ids: np.ndarray) -> None:
    """Clear the bits of `ids` in the int32 packed row `words`, in place."""
    if len(ids):
        np.bitwise_and.at(words, ids >> 5,
                          (~(np.uint32(1) << (ids & 31).astype(np.uint32))).view(np.int32))
