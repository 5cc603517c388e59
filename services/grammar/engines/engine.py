"""Constraint engines behind one interface: compile -> CompiledConstraint -> Matcher.

Two engines run constraints (the rule that picks one per compiled grammar:
docs/constraint-engines.md):

- `xgrammar` (engine of record): GBNF with token terminals, regex, choice, tool framing, and every
  grammar the other engine does not take (`engine_xgrammar.py`);
- `llguidance`: JSON Schema and json_object content (`engine_llguidance.py`), a
  lexer-based engine whose bitmasks have the same packed layout.

Nothing outside `services/grammar/` needs to know which one runs. The contract every engine keeps:

CompiledConstraint (immutable, shared by every request that uses it; thread-safe):
    engine: str                      "xgrammar" | "llguidance"
    domain: TokenDomain              the vocabulary it was compiled for
    matcher() -> Matcher             a fresh matcher at the start of the language
    memory_size_bytes: int           for the L1 byte budget (an estimate for llguidance)
    serialize_json() -> str          the store blob's text (engine tag line + the engine's own
                                     serialisation); `ModelCompiler.deserialize` reads it back

Matcher (one request's state; one thread at a time):
    accept_token(id) -> bool         False (state unchanged) when the token is not legal
    accept_bytes(data) -> bool       a continuation prefix, byte-exact; False leaves the state
                                     unchanged; not undoable by rollback
    rollback(n)                      undo the last n accept_token calls (EOS included);
                                     InternalError for more than were accepted
    fill_mask(out, row=0)            out: [N, ceil(V/32)] int32 CPU tensor (or numpy array),
                                     row `row` := the legal next tokens (bit i of word w = token
                                     32w+i, LSB first; EOS bits set where the language may end;
                                     bits past V zero). Never changes the state.
    is_completed() -> bool           the output so far may end (EOS legal), or EOS was accepted
    is_terminated() -> bool          EOS was accepted
    forced_bytes() -> bytes          the bytes every continuation of the output so far starts
                                     with (the grammar forces them, across rules; possibly
                                     ending inside a UTF-8 character); b"" where the next byte
                                     is free, or the output ended. Never changes the state.
    fill_lookahead(drafts, out, row=0) -> n
                                     one call for the K+1 masks of a speculative round (design
                                     document section 7): row+i := the mask after the output +
                                     drafts[:i] for i = 0..n, where n = drafts accepted (stops
                                     before the first illegal draft, after an accepted EOS, whose
                                     row n is then zero); rows row+n+1 .. row+len(drafts) zeroed;
                                     an all-zero row i <= n before any EOS is a dead end. The
                                     state is back at the output afterwards. Costs about K+1
                                     fills (the engines loop in C++ / Rust).

    A matcher never admits control, never-generable or padding ids unless its grammar names them
    with Token(id) (xgrammar only), and never an EOS id where the language cannot end.

fill_masks(matchers, out, rows, filler) -> {k: exception}
                                     several matchers' fill_mask in one call (the Program's
                                     batched ordinary decode step; engines/batch.py); `filler`
                                     is a MaskFiller, which owns each engine's thread pool. The
                                     matchers that failed come back by index: a failure is its
                                     row's alone.

Lookahead for K drafts (design document section 7) is the caller's loop over fill_mask /
accept_token and one rollback(accepted); both engines' rollback is O(tokens rolled back).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Sequence

from shared.errors import InternalError
from shared.frontends.token_domain import TokenDomain

XGRAMMAR = "xgrammar"
LLGUIDANCE = "llguidance"
ENGINES = (XGRAMMAR, LLGUIDANCE)


class Matcher(ABC):
    """One request's position in a compiled constraint (see the module docstring)."""

    engine: str

    @abstractmethod
    def accept_token(self, token: int) -> bool: ...

    @abstractmethod
    def accept_bytes(self, data: bytes) -> bool: ...

    @abstractmethod
    def rollback(self, n: int) -> None: ...

    @abstractmethod
    def fill_mask(self, out: Any, row: int = 0) -> None: ...

    @abstractmethod
    def is_completed(self) -> bool: ...

    @abstractmethod
    def is_terminated(self) -> bool: ...

    @abstractmethod
    def fill_lookahead(self, drafts: Sequence[int], out: Any, row: int = 0) -> int: ...

    @abstractmethod
    def forced_bytes(self) -> bytes: ...


class CompiledConstraint(ABC):
    """An immutable compiled grammar for one vocabulary (see the module docstring)."""

    engine: str
    domain: TokenDomain

    @abstractmethod
    def matcher(self) -> Matcher: ...

    @property
    @abstractmethod
    def memory_size_bytes(self) -> int: ...

    @abstractmethod
    def serialize_json(self) -> str: ...


def check_mask_buffer(out: Any, domain: TokenDomain) -> None:
    """Raise InternalError unless `out` is a C-contiguous [N, ceil(V/32)] int32 CPU buffer."""
    shape = tuple(out.shape)
    dtype = str(getattr(out, "dtype", ""))
    contiguous = out.is_contiguous() if hasattr(out, "is_contiguous") else \
        bool(out.flags["C_CONTIGUOUS"])
    device = getattr(getattr(out, "device", None), "type", "cpu")
    if len(shape) != 2 or shape[1] != domain.mask_words or "int32" not in dtype \
            or not contiguous or device != "cpu":
        raise InternalError(f"mask buffer must be a contiguous [N, {domain.mask_words}] int32 CPU "
                            f"array, got {list(shape)} {dtype} on {device}")


def buffer_address(out: Any, row: int) -> int:
    """The address of row `row` of a checked mask buffer (torch tensor or numpy array)."""
    if not 0 <= row < out.shape[0]:
        raise InternalError(f"mask row {row} outside a buffer of {out.shape[0]} rows")
    base = out.data_ptr() if hasattr(out, "data_ptr") else out.ctypes.data
    return base + row * out.shape[1] * 4


def lookahead_extent(out: Any, row: int, drafts: Sequence[int], domain: TokenDomain) -> int:
    """After an engine filled a lookahead chain: the drafts accepted, by the chain's own rules
    (a draft is accepted when its bit is set in the row before it; EOS ends the chain), with
    every row after the chain zeroed (the engines leave them unwritten)."""
    n = 0
    eos = False
    while n < len(drafts):
        t = int(drafts[n])
        if not (0 <= t < domain.size) or not (int(out[row + n, t >> 5]) >> (t & 31)) & 1:
            break
        n += 1
        if t in domain.eos_ids:
            eos = True
            break
    first_zero = row + n if eos else row + n + 1
    out[first_zero:row + len(drafts) + 1] = 0
    return n


__all__ = ["CompiledConstraint", "ENGINES", "LLGUIDANCE", "Matcher", "XGRAMMAR", "buffer_address",
           "check_mask_buffer", "lookahead_extent"]
