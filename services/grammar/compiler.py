"""From an OutputConstraint to an xgrammar CompiledGrammar for one model's token domain.

`build_grammar` validates and converts (no vocabulary involved); `ModelCompiler.compile` adds the
vocabulary. The compile cache (`services.grammar.cache`) wraps `ModelCompiler.compile` with the key
from `cache_key`. Every rejection is a typed RequestError raised before xgrammar sees the source.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import xgrammar as xgr

from services.grammar.regex.tree import ebnf_literal
from shared.contract import ConstraintKind, OutputConstraint
from shared.errors import InternalError, InvalidGrammar
from shared.frontends.token_domain import TokenDomain

if TYPE_CHECKING:
    from services.grammar.tools import ToolSpec

# What compiles: a content constraint, or a tool spec (tool framing, policy, optional JSON content).
Compilable = Union[OutputConstraint, "ToolSpec"]

# Bumped whenever a conversion changes the language a source compiles to: old cache entries die.
CONVERTER_VERSION = "1"
# The framing of a bare content constraint: the constrained bytes are the whole output.
RAW_FRAMING = "raw"


def choice_to_ebnf(choices: tuple[str, ...]) -> str:
    """Literal alternatives, case/whitespace/Unicode kept exactly; "" allows the empty output."""
    alts = sorted(set(choices))
    return "root ::= " + " | ".join(ebnf_literal(c) if c else '""' for c in alts) + "\n"


def source_kind(constraint: "Compilable") -> str:
    """The kind part of a cache key: a content constraint's kind, or "tools" for a tool spec."""
    return constraint.kind.value if isinstance(constraint, OutputConstraint) else "tools"


def framing_of(constraint: "Compilable") -> str:
    """The only framing a source compiles under: raw content, or the tool format's framing."""
    if isinstance(constraint, OutputConstraint):
        return RAW_FRAMING
    from services.grammar.tools import FRAMING

    return FRAMING


def build_grammar(constraint: "Compilable", domain: TokenDomain,
                  framing: str | None = None) -> xgr.Grammar:
    """Validate and convert a content constraint (raw framing) or a tool spec into an xgrammar
    Grammar; another `framing` (a thinking prefix, the XML tool format) is built by
    services/grammar/framing.py."""
    if framing is not None and framing != framing_of(constraint):
        from services.grammar.framing import build_framed_grammar

        return build_framed_grammar(constraint, framing, domain)
    if not isinstance(constraint, OutputConstraint):
        from services.grammar.tools import tool_grammar_ebnf

        return _from_ebnf(tool_grammar_ebnf(constraint), "tools")
    kind = constraint.kind
    if kind is ConstraintKind.GRAMMAR:
        from services.grammar.gbnf import gbnf_to_ebnf

        text = gbnf_to_ebnf(constraint.source, domain)
    elif kind is ConstraintKind.REGEX:
        from services.grammar.regex import regex_to_ebnf

        text = regex_to_ebnf(constraint.source)
    elif kind is ConstraintKind.CHOICE:
        text = choice_to_ebnf(constraint.choices)
    elif kind is ConstraintKind.JSON_OBJECT:
        from services.grammar.schema import json_object_grammar

        return json_object_grammar()
    elif kind is ConstraintKind.JSON_SCHEMA:
        from services.grammar.schema import schema_to_grammar

        return schema_to_grammar(constraint.schema)
    else:  # pragma: no cover - the enum is closed
        raise InternalError(f"unknown constraint kind {kind!r}")
    return _from_ebnf(text, kind.value)


def _from_ebnf(text: str, what: str) -> xgr.Grammar:
    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as exc:  # a conversion produced text xgrammar refuses: our bug
        raise InternalError(f"converted {what} grammar did not parse: {exc}") from None


def cache_key(
    constraint: "Compilable", domain: TokenDomain, *, framing: str = RAW_FRAMING, options: str = ""
) -> str:
    """hash(kind, canonical source, options, framing id, vocabulary id)."""
    h = hashlib.sha256()
    for part in (CONVERTER_VERSION, source_kind(constraint), constraint.canonical_source(), options,
                 framing, domain.vocab_id):
        h.update(len(part.encode()).to_bytes(8, "little"))
        h.update(part.encode())
    return h.hexdigest()


@dataclass(frozen=True)
class Framed:
    """A source compiled under a framing other than its own (a thinking prefix, the XML tool
    format): what travels through the cache, the build pools and the compile children in place
    of the bare source, so every builder compiles the same language the key names."""

    source: "Compilable"
    framing: str


def framed(constraint: "Compilable", framing: str) -> "Compilable | Framed":
    """`constraint` itself under its own framing, else wrapped with `framing`."""
    return constraint if framing == framing_of(constraint) else Framed(constraint, framing)


@dataclass(frozen=True)
class CompileOutcome:
    grammar: xgr.CompiledGrammar
    compile_ms: float


class ModelCompiler:
    """One model's vocabulary-bound xgrammar compiler, created lazily and thread-safely on first use
    (that time belongs to the first constrained request, never to unconstrained ones)."""

    def __init__(self, domain: TokenDomain) -> None:
        self.domain = domain
        self._lock = threading.Lock()
        self._info: xgr.TokenizerInfo | None = None
        self._compiler: xgr.GrammarCompiler | None = None

    @property
    def tokenizer_info(self) -> xgr.TokenizerInfo:
        self._ensure()
        assert self._info is not None
        return self._info

    def _ensure(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._info = self.domain.tokenizer_info()
                # Our own cache owns reuse; xgrammar's internal one stays off (it is unbounded).
                self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
            return self._compiler

    def compile(self, constraint: "Compilable", framing: str | None = None) -> CompileOutcome:
        """Validate, convert and compile (under `framing`, default the source's own); single-
        threaded inside, safe to call from many threads."""
        if isinstance(constraint, Framed):
            constraint, framing = constraint.source, constraint.framing
        start = time.perf_counter()
        grammar = build_grammar(constraint, self.domain, framing)
        compiler = self._ensure()
        try:
            compiled = compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise InvalidGrammar(f"grammar failed to compile: {exc}") from None
        return CompileOutcome(compiled, (time.perf_counter() - start) * 1000.0)

    def deserialize(self, text: str) -> xgr.CompiledGrammar:
        return xgr.CompiledGrammar.deserialize_json(text, self.tokenizer_info)
