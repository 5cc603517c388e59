"""The llguidance engine behind `services.grammar.engines.engine`'s interface.

The vocabulary (`lltokenizer(domain)`, built once per domain, ~1 s for Qwen3.5): every id's raw
bytes; EOS, control, never-generable ids and the padding rows past the token list are llguidance
special tokens, which no lexeme can match (their trie entries start with the byte 0xFF), and only
the EOS ids open where the grammar may end. Masks have xgrammar's packed layout, `ceil(V/32)` words.

A compiled constraint is a validated Lark grammar plus one template matcher that is never advanced;
every request's matcher is its `deep_copy` (~10 us instead of ~1 ms to build one), and the copies
share the template's lexer automaton, so states one request built are warm for the next.

Where llguidance and the contract differ, the wrapper restores the contract:
- a refused token must leave the state unchanged (llguidance's `consume_token` enters a permanent
  error state): `try_consume_tokens`, which stops before an illegal token;
- EOS must be acceptable wherever the language may end; llguidance refuses it once the grammar
  cannot be extended ("NoExtension"), so that EOS is recorded here (and undone by rollback);
- `accept_bytes` feeds the bytes as single-byte tokens; a byte the vocabulary has no single-byte
  token for (SmolLM2 lacks a few ASCII controls and invalid UTF-8 bytes) is refused, which is exact
  for the JSON languages this engine runs (none contains such a byte raw).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any, Sequence

import llguidance as llg

from services.grammar.engines.engine import (
    LLGUIDANCE,
    CompiledConstraint,
    Matcher,
    buffer_address,
    check_mask_buffer,
    lookahead_extent,
)
from shared.errors import InternalError
from shared.frontends.token_domain import TokenDomain

TAG = LLGUIDANCE + "\n"

# llguidance's parser limit on the Earley items of one row (its `max_items_in_row` default; it is
# checked only when a row is built, i.e. at decode time: "Current row has 5001 items; max is
# 2000"). A grammar whose static bound (`row_items_bound`) reaches half of it is not built here:
# the other half is the margin for the items a row holds beside one prediction.
MAX_ITEMS_IN_ROW = 2000
ROW_ITEMS_BUDGET = MAX_ITEMS_IN_ROW // 2


class BeyondLimits(Exception):
    """The grammar could exceed one of llguidance's decode-time limits: the compiler builds it on
    xgrammar instead, which has none (a limit llguidance checks only at decode time would fail
    the request there, after a compile that succeeded)."""


class _Vocabulary:
    def __init__(self, domain: TokenDomain) -> None:
        # Padding rows get a special spelling of their own: llguidance's token-id sets
        # (`<[^...]>`, the thinking framing's reasoning) admit an empty-spelled special token
        # even where the set excludes its id.
        self.tokens = list(domain.token_bytes) + [f"<|infernix-padding-{i}|>".encode() for i in
                                                  range(len(domain.token_bytes), domain.size)]
        self.eos_token_id = min(domain.eos_ids) if domain.eos_ids else domain.size - 1
        self.bos_token_id = None
        self.special_token_ids = sorted(domain.special_ids
                                        | set(range(len(domain.token_bytes), domain.size)))
        self._single = single_byte_tokens(domain)

    def __call__(self, data: bytes | str) -> list[int]:
        raw = data.encode("utf-8") if isinstance(data, str) else data
        return [t for t in (self._single[b] for b in raw) if t is not None]


def single_byte_tokens(domain: TokenDomain) -> list[int | None]:
    """For each byte value, an ordinary token consisting of exactly that byte (or None)."""
    out: list[int | None] = [None] * 256
    for i, b in enumerate(domain.token_bytes):
        if len(b) == 1 and out[b[0]] is None and domain.is_ordinary(i):
            out[b[0]] = i
    return out


# llguidance's "slices": token sets (each token in the first that matches all of it) that a mask
# adds whole when the current lexeme contains the slice, instead of walking their trie. Its own
# JSON slices stop at 10 characters: inside a string with fewer than 10 characters of maxLength
# left, or in a `pattern` of letters, every token was walked (2.7 ms and 1.0 ms per Qwen3.5 mask).
# A ladder of lengths and a few letter/digit classes keep those states sliced (0.97 and 0.27 ms at
# worst; measured with `infernix bench grammar`, docs/constraint-engines.md).
_CHAR = r'[^"\\\x00-\x1F\x7F]'
SLICES = ([r"[\x20\x0A\x0D\x09]+", r"[0-9]{1,10}", r"[a-z]{1,20}", r" ?[A-Za-z]{1,20}",
           r"[ A-Za-z,.]{1,20}"]
          + [_CHAR + "{1,%d}" % n for n in (1, 2, 3, 4, 6, 8, 10, 14, 20, 30, 60, 120)]
          + [_CHAR + "+"])


@lru_cache(maxsize=8)
def lltokenizer(domain: TokenDomain) -> llg.LLTokenizer:
    """The llguidance vocabulary of `domain` (built once per domain, ~2 s for Qwen3.5;
    thread-safe to share)."""
    eos = sorted(domain.eos_ids) or None
    return llg.LLTokenizer(llg.TokenizerWrapper(_Vocabulary(domain)), n_vocab=domain.size,
                           eos_token=eos, slices=SLICES)


@lru_cache(maxsize=1)
def _draft_executor() -> llg.LLExecutor:
    return llg.LLExecutor(1)  # a chain of one matcher runs on the calling thread's behalf


class LlguidanceMatcher(Matcher):
    engine = LLGUIDANCE

    def __init__(self, constraint: "LlguidanceConstraint") -> None:
        self.domain = constraint.domain
        self._size = constraint.domain.size
        self._m = constraint._template.deep_copy()
        self._single = constraint._single
        self._accepted = 0  # tokens rollback may undo
        self._virtual_eos = False  # an EOS accepted here after llguidance stopped

    def _check(self) -> None:
        if self._m.is_error():
            raise InternalError(f"llguidance matcher failed: {self._m.get_error()[:300]}")

    def accept_token(self, token: int) -> bool:
        if self._virtual_eos or not 0 <= token < self._size:
            return False
        if self._m.try_consume_tokens([token]) == 1:
            self._accepted += 1
            return True
        self._check()
        if token in self.domain.eos_ids and self._m.is_stopped() and self._m.is_accepting():
            self._virtual_eos = True
            self._accepted += 1
            return True
        return False

    def accept_bytes(self, data: bytes) -> bool:
        if self._virtual_eos or self.is_terminated():
            return not data
        ids = [self._single[b] for b in data]
        if any(i is None for i in ids):
            return False
        tokens: list[int] = ids  # type: ignore[assignment]
        if self._m.validate_tokens(tokens) != len(tokens):
            self._check()
            return False
        if not self._m.consume_tokens(tokens):
            self._check()
            raise InternalError("llguidance refused bytes it had validated")
        return True

    def rollback(self, n: int) -> None:
        if not 0 <= n <= self._accepted:
            raise InternalError(f"rollback({n}) with {self._accepted} tokens accepted")
        if n and self._virtual_eos:
            self._virtual_eos = False
            self._accepted -= 1
            n -= 1
        if n:
            if not self._m.rollback(n):
                self._check()
                raise InternalError(f"llguidance could not roll back {n} tokens")
            self._accepted -= n

    def fill_mask(self, out: Any, row: int = 0) -> None:
        check_mask_buffer(out, self.domain)
        self._m.unsafe_compute_mask_ptr(buffer_address(out, row), self.domain.mask_words * 4)
        self._check()

    def fill_lookahead(self, drafts: Sequence[int], out: Any, row: int = 0) -> int:
        check_mask_buffer(out, self.domain)
        buffer_address(out, row + len(drafts))  # bounds check
        if self.is_terminated():
            raise InternalError("lookahead after the output ended")
        legal = []  # an id outside the vocabulary ends the chain (it is illegal)
        for d in drafts:
            if not 0 <= int(d) < self.domain.size:
                break
            legal.append(int(d))
        if legal:
            _draft_executor().unsafe_compute_mask_ptr_with_draft_token(
                [(self._m, row, legal)], buffer_address(out, 0), self.domain.mask_words * 4,
                out.shape[0])
        else:
            self._m.unsafe_compute_mask_ptr(buffer_address(out, row), self.domain.mask_words * 4)
        self._check()
        return lookahead_extent(out, row, drafts, self.domain)

    def forced_bytes(self) -> bytes:
        if self.is_terminated() or self._m.is_stopped():
            return b""
        data = self._m.compute_ff_bytes()
        self._check()
        return bytes(data)

    def is_completed(self) -> bool:
        return self._virtual_eos or self._m.is_accepting()

    def is_terminated(self) -> bool:
        return self._virtual_eos or self._m.stop_reason() == "EndOfSentence"


class LlguidanceConstraint(CompiledConstraint):
    engine = LLGUIDANCE

    def __init__(self, lark: str, domain: TokenDomain) -> None:
        """Validate `lark` against the domain's vocabulary. Raises BeyondLimits when a row of its
        parse could outgrow `ROW_ITEMS_BUDGET`, InternalError (llguidance's message) when it does
        not build: a converter bug, or a grammar past llguidance's limits."""
        self.lark = lark
        self.domain = domain
        rows = row_items_bound(lark)
        if rows > ROW_ITEMS_BUDGET:
            raise BeyondLimits(f"up to {rows} Earley items in one row (budget {ROW_ITEMS_BUDGET})")
        grammar = llg.LLMatcher.grammar_from_lark(lark)
        self._template = llg.LLMatcher(lltokenizer(domain), grammar, log_level=0)
        if self._template.is_error():  # the constructor reports grammar errors this way
            raise InternalError(f"llguidance refused the grammar: "
                                f"{self._template.get_error()[:500]}")
        self._single = single_byte_tokens(domain)

    def matcher(self) -> LlguidanceMatcher:
        return LlguidanceMatcher(self)

    @property
    def memory_size_bytes(self) -> int:
        # An estimate: llguidance reports no sizes. The grammar, the parser tables built from it,
        # and a share of the lexer automaton that the matchers grow lazily.
        return 256 * 1024 + 64 * len(self.lark)

    def serialize_json(self) -> str:
        return TAG + self.lark


def load(text: str, domain: TokenDomain) -> LlguidanceConstraint:
    """The constraint of `serialize_json`'s text (tag line already checked by the caller)."""
    return LlguidanceConstraint(text[len(TAG):], domain)


def batch_pool(max_threads: int | str) -> llg.LLExecutor:
    return llg.LLExecutor(None if max_threads == "auto" else int(max_threads))


def batch_fill(pool: llg.LLExecutor, matchers: Sequence[Matcher], out: Any,
               rows: Sequence[int]) -> None:
    if not matchers:
        return
    domain = matchers[0].domain  # type: ignore[attr-defined]
    check_mask_buffer(out, domain)
    for r in rows:
        buffer_address(out, r)
    base = buffer_address(out, 0)
    pool.unsafe_compute_mask_ptr([(m._m, r) for m, r in zip(matchers, rows)],  # type: ignore[attr-defined]
                                 base, domain.mask_words * 4, out.shape[0])
    for m in matchers:
        m._check()  # type: ignore[attr-defined]


# ---------------------------------------------------------------- the static row bound

_LEX = re.compile(r'\s+|("(?:[^"\\]|\\.)*")|(/(?:[^/\\]|\\.)*/)|([A-Za-z_][A-Za-z0-9_]*)'
                  r'|(\{\d*,?\d*\})|([|()?*+&~])')


def _parse(body: str) -> list:
    """A rule body as alternatives of sequences; a symbol is a name, "lit" (a lexeme), a nested
    alternative list (a group) or ("opt", symbol) for a nullable repetition."""
    tokens = [m.group(0) for m in _LEX.finditer(body) if not m.group(0).isspace()]
    pos = 0

    def alts() -> list:
        nonlocal pos
        out = [seq()]
        while pos < len(tokens) and tokens[pos] == "|":
            pos += 1
            out.append(seq())
        return out

    def seq() -> list:
        nonlocal pos
        items: list = []
        while pos < len(tokens) and tokens[pos] not in "|)":
            tok = tokens[pos]
            pos += 1
            if tok == "(":
                item: Any = alts()
                pos += 1  # ")"
            elif tok in "&~":
                continue  # lexeme algebra: still one lexeme
            elif tok[0] in "\"/":
                item = "lit"
            else:
                item = tok if tok[0].islower() or tok[0] == "_" else "lit"
            while pos < len(tokens) and (tokens[pos] in "?*+" or tokens[pos][0] == "{"):
                q = tokens[pos]
                pos += 1
                if q in "?*" or q[1:2] in ("0", ","):
                    item = ("opt", item)
            items.append(item)
        return items

    return alts()


def row_items_bound(lark: str, cap: int = MAX_ITEMS_IN_ROW) -> int:
    """The most Earley items one prediction can add to a row of `lark` (our converters' Lark:
    `name: body` rules, upper-case lexemes): over every nonterminal, the productions of every
    nonterminal reachable through leading (nullable-prefixed) positions, each group and nullable
    repetition counted as its own nonterminal, as llguidance's grammar compiler makes them.
    Counting stops past `cap` (the answer is then some number above it)."""
    rules: dict[str, list] = {}
    for line in lark.splitlines():
        name, sep, body = line.partition(":")
        name = name.strip()
        if sep and re.fullmatch(r"[a-z_][a-z0-9_]*", name):
            rules[name] = _parse(body)
    empty: set[str] = set()  # the nullable rules

    def nullable(sym: Any) -> bool:
        if isinstance(sym, tuple):
            return True
        if isinstance(sym, list):
            return any(all(nullable(s) for s in prod) for prod in sym)
        return sym in empty

    changed = True
    while changed:  # the fixpoint of the nullable rules
        changed = False
        for name, prods in rules.items():
            if name not in empty and nullable(prods):
                empty.add(name)
                changed = True

    def predicted(prods: list, covered: set[str]) -> int:
        # the productions predicted with `prods`: its own, then those of each production's
        # leading symbols up to the first one that cannot be empty
        seen: set[int] = set()
        stack, total = [prods], 0
        while stack and total <= cap:
            group = stack.pop()
            if id(group) in seen:
                continue
            seen.add(id(group))
            total += len(group)
            for prod in group:
                for sym in prod:
                    inner = sym
                    if isinstance(sym, tuple):
                        total += 2  # the repetition's own (empty | more) productions
                        inner = sym[1]
                    if isinstance(inner, list):
                        stack.append(inner)
                    elif isinstance(inner, str) and inner in rules:
                        covered.add(inner)
                        stack.append(rules[inner])
                    if not nullable(sym):
                        break
        return total

    # A rule predicted at the start of another is counted inside the other's (larger) closure:
    # start from the rules nothing predicts first, then whatever they do not reach (cycles).
    def first(prods: list, out: set[str]) -> None:  # the rules `prods` predicts directly
        for prod in prods:
            for sym in prod:
                inner = sym[1] if isinstance(sym, tuple) else sym
                if isinstance(inner, list):
                    first(inner, out)
                elif isinstance(inner, str) and inner in rules:
                    out.add(inner)
                if not nullable(sym):
                    break

    led: set[str] = set()
    for prods in rules.values():
        first(prods, led)
    best, covered = 0, set()
    for name in sorted(rules, key=lambda n: n in led):
        if name not in covered:
            best = max(best, predicted(rules[name], covered))
            if best > cap:
                break
    return best
