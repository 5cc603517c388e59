"""The token domain of a model: raw bytes of every id and explicit special-token classes.

This is the one place where token semantics are decided. Nothing downstream infers a token's role
from its spelling:

- ordinary tokens match grammars by their raw bytes (no display decode, no UTF-8 repair);
- EOS ids are completion controls; the matcher opens them only where the language may end;
- control tokens (chat framing, thinking, tool markers) are never ordinary content candidates, but
  a model's framing grammar may name them by id with `Token(id)`;
- never-generable ids (embedding padding, vision placeholders) are never legal at all.

xgrammar is given these classes explicitly. A control token's bytes are handed to xgrammar as
`CONTROL_PREFIX + spelling`: the prefix is not valid UTF-8 and no grammar literal or character
class can match it, so the token stays out of every content rule, while `Token(id)` still reaches
it. (xgrammar 0.2.8 treats an empty-bytes token as "special", and `Token(id)` of such a token is
never legal; measured in tests/frontends/test_frontends_token_domain.py.) Never-generable ids get
empty bytes, which xgrammar never allows.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import xgrammar

# Two bytes that never occur in UTF-8 text; see the module docstring.
CONTROL_PREFIX = b"\xff\xfe"


@dataclass(frozen=True, eq=False)
class TokenDomain:
    """Raw token bytes and special classes of one vocabulary.

    `token_bytes[i]` is the raw byte string token `i` stands for in ordinary text; for special
    tokens it is their spelling (kept for display and tests, not used for matching). The domain
    covers `size` ids, the model's logits width: ids at or past `len(token_bytes)` are padding.
    """

    name: str  # "smollm2", "qwen3.5"
    token_bytes: tuple[bytes, ...]
    size: int  # logits / embedding rows, >= len(token_bytes)
    eos_ids: frozenset[int]
    control_ids: frozenset[int]  # special tokens legal only inside model framing rules
    never_ids: frozenset[int] = field(default_factory=frozenset)  # never legal (besides padding)
    special_names: tuple[tuple[str, int], ...] = ()  # spelling -> id of every special token

    def __post_init__(self) -> None:
        if self.size < len(self.token_bytes):
            raise ValueError(
                f"size {self.size} is smaller than the vocabulary {len(self.token_bytes)}"
            )
        overlap = (self.eos_ids & self.control_ids) | (
            self.never_ids & (self.eos_ids | self.control_ids)
        )
        if overlap:
            raise ValueError(f"token ids {sorted(overlap)} are in more than one special class")

    @property
    def mask_words(self) -> int:
        """32-bit words per mask row: ceil(size / 32)."""
        return (self.size + 31) // 32

    @cached_property
    def vocab_id(self) -> str:
        """A stable hash of everything that changes compiled grammars for this vocabulary."""
        h = hashlib.sha256()
        h.update(f"{self.name}|{self.size}|".encode())
        for ids in (self.eos_ids, self.control_ids, self.never_ids):
            h.update(",".join(map(str, sorted(ids))).encode() + b"|")
        for b in self.token_bytes:
            h.update(len(b).to_bytes(4, "little") + b)
        return h.hexdigest()[:24]

    @cached_property
    def special_ids(self) -> frozenset[int]:
        return self.eos_ids | self.control_ids | self.never_ids

    @cached_property
    def byte_token_ids(self) -> tuple[int, ...]:
        """For each byte value 0..255, the ordinary token whose bytes are exactly that byte (the
        smallest such id), or -1 when the vocabulary has none."""
        out = [-1] * 256
        for i, b in enumerate(self.token_bytes):
            if len(b) == 1 and out[b[0]] < 0 and self.is_ordinary(i):
                out[b[0]] = i
        return tuple(out)

    @cached_property
    def ascii_text(self) -> tuple[str | None, ...]:
        """For each id below `len(token_bytes)`: the text of an ordinary token whose bytes are
        ASCII (they decode alone, whatever came before them), else None."""
        special = self.special_ids
        return tuple(b.decode("ascii") if b.isascii() and i not in special else None
                     for i, b in enumerate(self.token_bytes))

    def is_ordinary(self, token_id: int) -> bool:
        """True for ids that may appear as content (matched by their bytes)."""
        return 0 <= token_id < len(self.token_bytes) and token_id not in self.special_ids

    def special_id(self, spelling: str) -> int:
        for name, token_id in self.special_names:
            if name == spelling:
                return token_id
        raise KeyError(spelling)

    def encoded_vocab(self) -> list[bytes]:
        """The byte strings handed to xgrammar, one per id below `len(token_bytes)`."""
        out = list(self.token_bytes)
        for i in self.control_ids:
            out[i] = CONTROL_PREFIX + self.token_bytes[i]
        for i in self.eos_ids | self.never_ids:
            if i < len(out):
                out[i] = b""
        return out

    def tokenizer_info(self) -> "xgrammar.TokenizerInfo":
        """An xgrammar TokenizerInfo built from the explicit classes, never from guesses."""
        import xgrammar

        return xgrammar.TokenizerInfo(
            self.encoded_vocab(),
            xgrammar.VocabType.RAW,
            vocab_size=self.size,
            stop_token_ids=sorted(self.eos_ids),
            add_prefix_space=False,
        )


def gpt2_byte_decoder() -> dict[str, int]:
    """The inverse of GPT-2's byte-to-printable-character table used by byte-level BPE
    vocabularies."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\xa1"), ord("\xac") + 1))
        + list(range(ord("\xae"), ord("\xff") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def byte_level_to_bytes(token: str, decoder: dict[str, int]) -> bytes:
    """Raw bytes of a GPT-2 byte-level token spelling (e.g. 'Ġhello' -> b' hello')."""
    return bytes(decoder[c] for c in token)
