"""ItemProbe: whether, after a token, the open item of a unique array can still become an unused
value, asked through the matcher, with the answers kept by a digest of the output read so far.

The probe accepts the token, walks single-byte tokens through the matcher depth-first (accept,
then roll back) until the companion's reader is settled (unique_items.py: the grammar then
guarantees a fresh completion) or every way over the used items' spellings is used up, and rolls
back. Each step fills one mask and answers at once when a byte the grammar takes settles the
reader; the others are searched.

Answers are kept by the digest of every byte and control token the request accepted
(json_probe.Key, here with the layout kept in: the key then names the matcher's state and the
reader's, its used items included, whichever tokens spelled the bytes). So the repeated masks of
one state, the tokens of one mask that reach one text (`"al` and `"` then `al`) and the next
position's probes along the same item share one search. A True found below the top is kept too
(a way out is one whatever led there); a False only for a whole probe: below the top a search
skips the states its ancestors hold (whitespace between items comes back to one state), so its
False is the ancestors' to give.

`counted(state)` answers without a probe where the item domain's facts decide (schema/
unique_items.py hands them over): a finite domain by its values, a plain length-bounded string
domain and an integer range by a count.
"""

from __future__ import annotations

from services.grammar.json_probe import CACHE_LIMIT, PROBE_BUDGET, ByteSteps, Key
from shared.frontends.token_domain import TokenDomain


class ItemProbe:
    """The probes of one request's unique-items companion and their answers. `reader`: the
    companion's ItemReader; `cache`: False runs every search afresh (the reference the tests
    compare the kept answers with)."""

    def __init__(self, reader, domain: TokenDomain, cache: bool = True) -> None:
        self.reader = reader
        self.domain = domain
        self.cache = cache
        self.answers: dict[bytes, bool] = {}
        self.probes = 0  # searches run
        self.hits = 0  # probes answered from `answers`
        self.gave_up = 0  # probes that ran out of PROBE_BUDGET (the token was kept)
        self._steps: ByteSteps | None = None

    def probe(self, matcher, token: int, after: tuple, key: Key) -> bool:
        """Whether, once `token` is accepted (the reader then in `after`, the output read so far
        digested as `key`), the open item can still become an unused value. `matcher` is left
        as it was."""
        digest = key.digest()
        if self.cache:
            known = self.answers.get(digest)
            if known is not None:
                self.hits += 1
                return known
        self.probes += 1
        if not matcher.accept_token(token):
            return False
        budget = [PROBE_BUDGET]
        try:
            found = self._search(matcher, after, key, budget, set())
        finally:
            matcher.rollback(1)
        if budget[0] <= 0:
            self.gave_up += 1
            return True
        self._keep(digest, found)
        return found

    def _keep(self, digest: bytes, found: bool) -> None:
        if self.cache:
            if len(self.answers) >= CACHE_LIMIT:
                self.answers.clear()
            self.answers[digest] = found

    def _search(self, matcher, state: tuple, key: Key, budget: list[int], seen: set) -> bool:
        # Depth-first over the single bytes the grammar takes, until a settled state (True) or
        # every way is used up (False); `seen`: the reader states on the way here.
        if self.reader.settled(state) or budget[0] <= 0:
            return True
        if state in seen:
            return False
        if seen and self.cache:
            known = self.answers.get(key.digest())
            if known is not None:  # a False was a whole probe's: a narrower search finds none
                return known
        seen = seen | {state}
        if self._steps is None:
            self._steps = ByteSteps(self.domain)
        budget[0] -= 16
        deeper = []
        for byte in self._steps.legal(matcher):
            try:
                child = self.reader.step(state, byte)
            except self.reader.refused:
                continue
            if self.reader.settled(child):
                self._found(key, budget, seen)
                return True
            deeper.append((byte, child))
        for byte, child in deeper:
            t = self.domain.byte_token_ids[byte]
            budget[0] -= 1
            if not matcher.accept_token(t):
                continue
            try:
                below = key.extended(bytes((byte,)))
                if self._search(matcher, child, below, budget, seen):
                    self._found(key, budget, seen)
                    return True
            finally:
                matcher.rollback(1)
            if budget[0] <= 0:
                return True
        return False

    def _found(self, key: Key, budget: list[int], seen: set) -> None:
        # A way out below the top (the top keeps its own answer, False included).
        if len(seen) > 1 and budget[0] > 0:
            self._keep(key.digest(), True)


def counted(state: tuple) -> bool | None:
    """Whether an open string item can still become an unused value, where
    the domain's facts decide it without a probe: a finite domain, by its values (the grammar
    spells each one way, so the text so far continues into exactly the values its content
    begins); strings of [lo, hi] code points, by a count (at least 93 plain printable ASCII
    characters at each place left, an open escape the one it ends in, against the used items
    sharing the content). None: probe."""
    _, frames, item = state
    if item is None:
        return None
    dom, used = frames[-1][3], frames[-1][4]
    if item[0] != "s":
        return _counted_integers(dom, used, item[1]) if dom.integers is not None else None
    _, done, pend, _ = item[1]
    ways = _ESCAPES.get(pend)
    if ways is None:
        return None
    if dom.values is not None:
        if pend:
            return None
        return any(k[0] == "s" and k[1].startswith(done) and k not in used for k in dom.values)
    if dom.lengths is None:
        return None
    try:
        n = len(done.decode("utf-8"))  # strict: a split character or a lone surrogate probes
    except UnicodeDecodeError:
        return None
    left = dom.lengths[1] - n
    if left == 0 and not pend:  # only the closing quote: the content is the used item it begins
        return False
    if left <= 0:
        return None
    sharing = sum(1 for k in used if k[0] == "s" and k[1].startswith(done))
    return True if left > 3 or ways * 93 ** (left - 1) > sharing else None


def _counted_integers(dom, used: frozenset, text: bytes) -> bool | None:
    """True where more integers of the domain are spelled (canonically, the grammar's one
    spelling) from the open number's `text` on than used items are; None: probe."""
    lo, hi, m = dom.integers
    digits = text[1:] if text.startswith(b"-") else text
    if not digits.isdigit() and digits:
        return None
    total = 0
    for k in range(0, 21 - len(digits)):  # every length up to 64-bit integers' 20 digits
        if not digits:  # only the sign: every negative value
            a, b = lo, -1
        elif digits.startswith(b"0"):
            if k or len(digits) > 1 or text.startswith(b"-"):
                break  # a leading zero ends the number (and "-0" is no canonical spelling)
            a = b = 0
        else:
            d = int(digits) * 10 ** k
            a, b = (d, d + 10 ** k - 1) if not text.startswith(b"-") else (-(d + 10 ** k - 1), -d)
        a, b = max(a, lo), min(b, hi)
        if a <= b:
            total += b // m - -(-a // m) + 1
        if not digits:
            break
    sharing = sum(1 for k in used if k[0] == "n" and str(int(k[1])).encode().startswith(text))
    return True if total > sharing else None


# Distinct characters an open escape of a string can still become, at least: none open, the 93
# plain printable ASCII ones (every JSON string grammar writes them raw); `\\` or `\\u`, the one
# it ends in (which escapes a grammar spells is its own: llguidance takes `\\u00` and a control
# character only); another partial escape probes.
_ESCAPES = {b"": 93, b"\\": 1, b"\\u": 1}


__all__ = ["ItemProbe", "counted"]
