"""Copying modulo JSON layout: the n-gram proposer's match and copy across whitespace.

A constrained answer is laid out by its grammar (newlines and indentation, `": "`), a prompt often
holds the same JSON compact (`{"a": 1, "b": [2]}`), so an exact token n-gram finds no match, or
matches the answer's own layout tokens and copies the wrong value. Here the context's text is
normalized (whitespace next to JSON punctuation `{ } [ ] , : "` removed, on both sides alike), the
longest normalized suffix of 32, 16 or 8 bytes is looked up earlier in it, and the text that
followed the match is copied in the answer's own layout: each whitespace run of the source next
to punctuation becomes the run the answer itself last wrote between the same two bytes (its
indentation, `": "` or `":"`); where the answer has none yet the copy stops. The copy is tokenized
canonically by the target's tokenizer; a copy cut by its length limit drops its last token, which
the next byte might have merged into.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from services.worker.spec.grammar import complete_utf8

_BREAKS = ((ord(","), ord('"')), (ord("{"), ord('"')), (ord("["), ord('"')))
_LAYOUT = re.compile(rb'[ \t\r\n]+(?=[{}\[\],:"])|(?<=[{}\[\],:"])[ \t\r\n]+')
SUFFIXES = (32, 16, 8)  # normalized suffix lengths tried, longest first


def normalize(data: bytes) -> tuple[bytes, list[tuple[int, int]]]:
    """`data` without its layout whitespace, and the removed spans (start, end) in `data`."""
    spans = [m.span() for m in _LAYOUT.finditer(data)]
    if not spans:
        return data, []
    parts, last = [], 0
    for s, e in spans:
        parts.append(data[last:s])
        last = e
    parts.append(data[last:])
    return b"".join(parts), spans


def to_original(pos: int, spans: Sequence[tuple[int, int]]) -> int:
    """The byte position in the original text of normalized position `pos`; a removed span
    that starts exactly there is not skipped (the copy starts with that layout run)."""
    shift = 0
    for s, e in spans:
        if s - shift >= pos:
            break
        shift += e - s
    return pos + shift


def layout_copy(data: bytes, encode: Callable[[str], list[int]], k: int,
                limit: int = 0) -> list[int]:
    """Up to k drafts continuing `data` (the context's text: prompt + committed output) copied
    modulo layout (see the module docstring); [] when no suffix matches. `limit`: bytes copied
    at most (default 12 k)."""
    if k <= 0:
        return []
    norm, spans = normalize(data)
    start = None
    for n in SUFFIXES:
        if len(norm) <= n:
            continue
        hit = norm.rfind(norm[-n:], 0, len(norm) - 1)
        if hit >= 0:
            start = to_original(hit + n, spans)
            break
    if start is None or start >= len(data) or data[start] & 0xC0 == 0x80:
        return []
    # the answer's own whitespace between two bytes (its latest run wins); a run the context
    # ends inside is written in part already
    runs: dict[tuple[int, int], bytes] = {}
    written = b""
    for s, e in spans:
        if s > 0 and e < len(data):
            runs[(data[s - 1], data[e])] = data[s:e]
        elif e == len(data):
            written = data[s:e]
    limit = limit or 12 * k
    if any(b"\n" in runs.get(pair, b"") for pair in _BREAKS):
        out, cut = _indented_copy(data, start, written, runs, limit)
    else:
        out, cut = _run_copy(data, start, written, runs, dict(spans), limit)
    head, tail = complete_utf8(bytes(out))
    tokens = encode(head.decode("utf-8")) if head else []
    if (cut or tail) and tokens:
        tokens = tokens[:-1]
    return tokens[:k]


def _run_copy(data, i, written, runs, span_at, limit) -> tuple[bytearray, bool]:
    """The source from i with each layout run replaced by the answer's run between the same
    two bytes (a single-line answer: its spacing); stops where the answer has none."""
    out = bytearray()
    while i < len(data):
        if len(out) >= limit:
            return out, True
        end = span_at.get(i)
        if end is not None:
            run = runs.get((data[i - 1], data[end])) if end < len(data) else None
            if run is None or not run.startswith(written):
                break  # no layout of the answer's own to copy into
            out += run[len(written):]
            written = b""
            i = end
            continue
        written = b""
        out.append(data[i])
        i += 1
    return out, False


def _indented_copy(data, i, written, runs, limit) -> tuple[bytearray, bool]:
    """The source from i re-laid-out as an indented answer: outside strings the source's
    whitespace is dropped and a newline with the answer's indentation is written after `{`, `[`
    and `,` and before `}`, `]` (one unit deeper after an opener, one less before a closer), the
    answer's own run after `:`. The string state and indentation at the start are those of the
    answer's current line; the unit is its smallest indentation."""
    base = data[:len(data) - len(written)]  # the answer's current line, before any run it
    line = base[base.rfind(b"\n") + 1:]  # has begun to write at its end
    indent = len(line) - len(line.lstrip(b" "))
    widths = [len(r) - r.rfind(b"\n") - 1 for r in runs.values() if b"\n" in r]
    unit = min((w for w in widths if w > 0), default=2)
    in_string = _open_quotes(line)
    colon = runs.get((ord(":"), ord('"')), b" ")
    prev = data.rstrip()[-1:]  # the answer's last byte before the copy (the match ends alike)
    out = bytearray()
    while i < len(data):
        if len(out) >= limit:
            return out, True
        c = data[i]
        if in_string:
            out.append(c)
            if c == 0x5C and i + 1 < len(data):  # an escape: the next byte is the string's
                out.append(data[i + 1])
                i += 1
            elif c == 0x22:
                in_string = False
            i += 1
            prev = b'"'
            continue
        if c in b" \t\r\n":
            i += 1
            continue
        ws = b""
        if prev in (b"{", b"[") and c not in b"}]":
            indent += unit
            ws = b"\n" + b" " * indent
        elif c in b"}]" and prev not in (b"{", b"["):
            indent -= unit
            ws = b"\n" + b" " * indent
        elif prev == b",":
            ws = b"\n" + b" " * indent
        elif prev == b":":
            ws = colon
        if indent < 0 or not ws.startswith(written):
            break
        out += ws[len(written):]
        written = b""
        out.append(c)
        in_string = c == 0x22
        prev = bytes([c])
        i += 1
    return out, False


def _open_quotes(line: bytes) -> bool:
    """Whether `line` ends inside a JSON string (an odd number of unescaped quotes)."""
    inside, j = False, 0
    while j < len(line):
        if line[j] == 0x5C and inside:
            j += 2
            continue
        if line[j] == 0x22:
            inside = not inside
        j += 1
    return inside
