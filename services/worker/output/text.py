"""UTF-8 publication: output bytes become `str` deltas, an unfinished character is held back.

The session hands `decode(held, new, final)` the committed-but-unpublished bytes and the bytes of
the tokens it previews; it returns the text to publish and the bytes to keep holding. A final
decode (EOS, a length cut, an interruption) flushes everything, an unfinished character as U+FFFD,
and says so: such a display is truncated, never a grammar success.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass


@dataclass(frozen=True)
class Decoded:
    text: str  # publishable now
    held: bytes  # bytes of an unfinished character, kept for the next decode
    truncated: bool  # a final decode flushed an unfinished character as U+FFFD


def decode(held: bytes, new: bytes, *, final: bool) -> Decoded:
    data = held + new
    if final:
        _, consumed = codecs.utf_8_decode(data, "replace", False)
        return Decoded(data.decode("utf-8", "replace"), b"", consumed < len(data))
    text, consumed = codecs.utf_8_decode(data, "replace", False)
    return Decoded(text, data[consumed:], False)
