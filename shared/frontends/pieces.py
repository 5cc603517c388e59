"""What the output decoder hands a tool-call stream: text, or a control token kept as itself.

A model whose tool framing uses control tokens (Qwen3.5's `<tool_call>` / `</tool_call>`) must be
read by token id, never by spelling: the phase decoder (thinking.py) turns committed token ids into
`str` pieces (UTF-8 text of ordinary tokens) and `Control` pieces (one per control token), and the
tool stream of the format decides what a control token means. A format whose opener is text
(Hermes) reads a `Control` as its spelling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Control:
    """One control token of the output, by id; `spelling` is how it displays."""

    token_id: int
    spelling: str


Piece = Union[str, Control]


def piece_text(piece: Piece) -> str:
    """The display text of a piece (a control token's spelling)."""
    return piece.spelling if isinstance(piece, Control) else piece


__all__ = ["Control", "Piece", "piece_text"]
