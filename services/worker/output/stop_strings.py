"""Stop strings of an unconstrained request: cut the published text where one first appears.

Text is streamed through `feed`: the part that cannot be the start of a stop string is released
at once, the rest is held until it either completes a stop string (released up to it, then the
request stops) or can no longer do so. Stop strings are never published. `flush` releases what is
held when the request ends for another reason.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        self.matched: str | None = None  # the stop string that stopped the output

    def feed(self, text: str) -> str:
        """Add `text`; return what may be published now. Sets `stopped` at a complete stop string
        (everything after it is dropped, also in later calls)."""
        if self.stopped:
            return ""
        buf = self._held + text
        found = [(i, -len(s), s) for s in self.stops if (i := buf.find(s)) >= 0]
        if found:
            cut, _, self.matched = min(found)  # the earliest; the longest of those starting there
            self.stopped = True
            self._held = ""
            return buf[:cut]
        keep = 0
        for s in self.stops:  # the longest tail of buf that is a proper prefix of a stop string
            for n in range(min(len(s) - 1, len(buf)), keep, -1):
                if buf.endswith(s[:n]):
                    keep = n
                    break
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[:len(buf) - keep]

    def flush(self) -> str:
        """Release the held text (the request ended without completing a stop string)."""
        out, self._held = ("" if self.stopped else self._held), ""
        return out
