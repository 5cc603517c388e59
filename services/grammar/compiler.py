"""From an OutputConstraint (or a tool spec) to a compiled constraint for one model's token domain.

`build_grammar` validates and converts to xgrammar's Grammar (no vocabulary involved; under a
framing, `build_framed_grammar` wraps it in framing.py's pieces); `ModelCompiler.compile` picks
the engine (`choose_engine`, the rule of docs/constraint-engines.md) and adds the vocabulary,
returning a `services.grammar.engines.engine.CompiledConstraint`. The compile cache
(`services.grammar.cache.grammar_cache`) wraps `ModelCompiler.compile` with the key from
`cache_key`. Every rejection is a typed RequestError raised before an engine sees the source.
"""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Union

import xgrammar as xgr

from services.grammar.engines import engine_llguidance, engine_xgrammar
from services.grammar.engines.engine import LLGUIDANCE, XGRAMMAR, CompiledConstraint
from services.grammar.engines.engine_llguidance import BeyondLimits, LlguidanceConstraint
from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.framing import (
    check_framing,
    implicit_close_applies,
    implicit_close_ebnf,
    thinking_prefix_ebnf,
    thinking_prefix_lark,
)
from services.grammar.regex.tree import ebnf_literal
from services.settings import UsageError, switch
from shared.contract import ConstraintKind, OutputConstraint
from shared.errors import InternalError, InvalidGrammar, Unsupported
from shared.frontends.formats import HERMES
from shared.frontends.frontend import split_framing
from shared.frontends.thinking import SPECS
from shared.frontends.token_domain import TokenDomain

if TYPE_CHECKING:
    from services.grammar.tools.hermes import ToolSpec

# What compiles: a content constraint, or a tool spec (tool framing, policy, optional JSON content).
Compilable = Union[OutputConstraint, "ToolSpec"]

# Bumped whenever a conversion changes the language a source compiles to: old cache entries die.
CONVERTER_VERSION = "9"
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
    from services.grammar.tools.hermes import FRAMING

    return FRAMING


def build_grammar(constraint: "Compilable", domain: TokenDomain,
                  framing: str | None = None) -> xgr.Grammar:
    """Validate and convert a content constraint (raw framing) or a tool spec into an xgrammar
    Grammar; another `framing` (a thinking prefix, the XML tool format) is built by
    `build_framed_grammar`."""
    if framing is not None and framing != framing_of(constraint):
        return build_framed_grammar(constraint, framing, domain)
    if not isinstance(constraint, OutputConstraint):
        from services.grammar.tools.hermes import tool_grammar_ebnf

        content = constraint.content
        ws = "any" if content is None else whitespace_of(content, domain)
        return _from_ebnf(tool_grammar_ebnf(constraint, whitespace=ws), "tools")
    kind = constraint.kind
    if kind is ConstraintKind.GRAMMAR:
        from services.grammar.gbnf import gbnf_to_ebnf

        text = gbnf_to_ebnf(constraint.source, domain)
    elif kind is ConstraintKind.REGEX:
        from services.grammar.gbnf import regex_to_optimized_ebnf

        text = regex_to_optimized_ebnf(constraint.source)
    elif kind is ConstraintKind.CHOICE:
        text = choice_to_ebnf(constraint.choices)
    elif kind is ConstraintKind.JSON_OBJECT:
        from services.grammar.schema import json_object_grammar

        return json_object_grammar(whitespace_of(constraint, domain))
    elif kind is ConstraintKind.JSON_SCHEMA:
        from services.grammar.schema import schema_to_grammar

        return schema_to_grammar(constraint.schema, whitespace=whitespace_of(constraint, domain),
                                 explicit_layout=constraint.whitespace is not None,
                                 unique_names=True, unique_items=True,
                                 counted_lengths=True)
    else:  # pragma: no cover - the enum is closed
        raise InternalError(f"unknown constraint kind {kind!r}")
    return _from_ebnf(text, kind.value)


def _inner_grammar(constraint: Compilable, inner: str, domain: TokenDomain) -> xgr.Grammar:
    """The language inside the framing: the content constraint, or the tool grammar of the
    format `inner`."""
    if isinstance(constraint, OutputConstraint) or inner == HERMES.framing:
        return build_grammar(constraint, domain)
    from services.grammar.tools.xml_tools import xml_tool_grammar_ebnf

    try:
        text = xml_tool_grammar_ebnf(constraint, domain)
    except ValueError as e:  # the vocabulary lacks the format's control tokens
        raise Unsupported(f"the XML tool format needs {e}", field="framing") from None
    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as exc:  # our conversion produced text xgrammar refuses: our bug
        raise InternalError(f"converted XML tool grammar did not parse: {exc}") from None


def build_framed_grammar(constraint: Compilable, framing: str, domain: TokenDomain) -> xgr.Grammar:
    """The grammar of `constraint` under `framing` for `domain`. Raises Unsupported for a framing
    that does not fit and the inner conversion's typed errors."""
    check_framing(constraint, framing)
    thinking, inner = split_framing(framing)
    if implicit_close_applies(constraint, thinking, inner):
        from services.grammar.tools.xml_tools import xml_tool_grammar_ebnf

        try:
            text = xml_tool_grammar_ebnf(constraint, domain)
        except ValueError as e:  # the vocabulary lacks the format's control tokens
            raise Unsupported(f"the XML tool format needs {e}", field="framing") from None
        return _from_ebnf(implicit_close_ebnf(SPECS[thinking], text, domain), "framed XML tool")
    grammar = _inner_grammar(constraint, inner, domain)
    if thinking is None:
        return grammar
    prefix = xgr.Grammar.from_ebnf(thinking_prefix_ebnf(SPECS[thinking], domain))
    return xgr.Grammar.concat(prefix, grammar)


def _from_ebnf(text: str, what: str) -> xgr.Grammar:
    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as exc:  # a conversion produced text xgrammar refuses: our bug
        raise InternalError(f"converted {what} grammar did not parse: {exc}") from None


# The JSON whitespace profile of a request that names none, per built-in model (measured with
# bench/json_whitespace.py, docs/benchmarks.md "JSON whitespace": SmolLM2 valid JSON within
# 256 tokens any 49/60, indented 58/60, compact 60/60 but off the model's own layout, which the
# design document warns against); other models get the contract's `any`.
DEFAULT_WHITESPACE: dict[str, str] = {"smollm2": "indented"}


def whitespace_of(constraint: OutputConstraint, domain: TokenDomain) -> str:
    """The whitespace profile a JSON constraint compiles with on `domain` ("any" for non-JSON)."""
    if constraint.kind not in _JSON_KINDS:
        return "any"
    return constraint.whitespace or DEFAULT_WHITESPACE.get(domain.name, "any")


def cache_key(
    constraint: "Compilable", domain: TokenDomain, *, framing: str = RAW_FRAMING, options: str = ""
) -> str:
    """hash(kind, canonical source, whitespace profile, options, framing id, vocabulary id)."""
    content = constraint if isinstance(constraint, OutputConstraint) else constraint.content
    ws = "any" if content is None else whitespace_of(content, domain)
    h = hashlib.sha256()
    for part in (CONVERTER_VERSION, source_kind(constraint), constraint.canonical_source(), ws,
                 options, framing, domain.vocab_id):
        h.update(len(part.encode()).to_bytes(8, "little"))
        h.update(part.encode())
    return h.hexdigest()


# The engines ModelCompiler.compile can build.
BUILDABLE = (XGRAMMAR, LLGUIDANCE)
_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.JSON_OBJECT)


# The worker's OutputSession and Program drive matchers through engines/engine.py's interface
# only, so a constraint may run on either engine.
WORKER_USES_ENGINE_INTERFACE = True


def choose_engine(constraint: "Compilable", *, interface: bool | None = None) -> str:
    """The engine a constraint compiles on (the rule of docs/constraint-engines.md): llguidance
    for JSON Schema and json_object content and for Hermes tool grammars (JSON arguments, and JSON
    content under the union, inside a literal envelope); xgrammar, the engine of record, for
    everything else (GBNF with its token terminals, regex, choice). Both write the same language.
    `json_engine` set to xgrammar puts all of it back on xgrammar.

    `interface` (default `WORKER_USES_ENGINE_INTERFACE`): whether the consumers can run engines
    other than xgrammar; without it everything compiles on xgrammar."""
    ready = WORKER_USES_ENGINE_INTERFACE if interface is None else interface
    if ready and _has_lark(constraint, framing_of(constraint)) and json_engine() == LLGUIDANCE:
        return LLGUIDANCE
    return XGRAMMAR


def _has_lark(constraint: "Compilable", framing: str) -> bool:
    """Whether `constraint` under `framing` has a Lark form (`build_llguidance_lark`): JSON content
    or a Hermes tool spec, bare or after a thinking framing (the thinking prefix is token-level
    and has an exact Lark form, `framing.thinking_prefix_lark`)."""
    thinking, inner = split_framing(framing)
    if thinking is not None and thinking not in SPECS:
        return False
    if isinstance(constraint, OutputConstraint):
        return inner == RAW_FRAMING and constraint.kind in _JSON_KINDS
    return inner == HERMES.framing


def framed_engine(constraint: "Compilable", framing: str) -> str:
    """The engine a source compiles on under a framing other than its own: llguidance for JSON
    content or a Hermes tool spec after a thinking framing when `choose_engine` puts the bare
    source on llguidance; xgrammar for every other framing (the Qwen XML tool format, whose
    grammars are written in EBNF)."""
    if _has_lark(constraint, framing) and choose_engine(constraint) == LLGUIDANCE:
        return LLGUIDANCE
    return XGRAMMAR


def build_llguidance_lark(constraint: "Compilable", framing: str | None,
                          domain: TokenDomain) -> str:
    """The Lark text of `constraint` under `framing` (None: its own), the language
    `build_grammar` gives xgrammar: JSON content (`build_lark`) or a Hermes tool spec
    (`tool_grammar_lark`), after the thinking prefix when the framing has one. Raises the
    source's typed RequestErrors, Unsupported for a framing that does not fit, and
    emit.NeedsXgrammar for a schema form only the xgrammar emission writes."""
    if framing is not None:
        check_framing(constraint, framing)
    thinking, _ = split_framing(framing or framing_of(constraint))
    if isinstance(constraint, OutputConstraint):
        text = build_lark(constraint, domain)
    else:
        from services.grammar.tools.hermes import tool_grammar_lark

        content = constraint.content
        ws = "any" if content is None else whitespace_of(content, domain)
        text = tool_grammar_lark(constraint, whitespace=ws)
    return text if thinking is None else thinking_prefix_lark(SPECS[thinking], domain, text)


def json_engine() -> str:
    """The engine of JSON content: llguidance unless the operator sets INFERNIX_JSON_ENGINE to
    xgrammar (the engine of record for everything; read at each compile, also in compile
    children). Raises InternalError for another value."""
    try:
        return switch("json_engine")
    except UsageError as exc:
        raise InternalError(str(exc)) from None


def build_lark(constraint: OutputConstraint, domain: TokenDomain) -> str:
    """Validate and convert a JSON content constraint into llguidance Lark text (the language
    `build_grammar` gives xgrammar). Raises the schema's typed RequestErrors."""
    from services.grammar.schema import schema_to_lark

    if constraint.kind not in _JSON_KINDS:
        raise InternalError(f"llguidance runs JSON content only, not {constraint.kind.value}")
    schema = {"type": "object"} if constraint.kind is ConstraintKind.JSON_OBJECT \
        else constraint.schema
    return schema_to_lark(schema, whitespace=whitespace_of(constraint, domain),
                          explicit_layout=constraint.whitespace is not None, unique_names=True,
                          unique_items=True, counted_lengths=True)


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
    grammar: CompiledConstraint
    compile_ms: float


class ModelCompiler:
    """One model's vocabulary-bound compilers, created lazily and thread-safely on first use
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

    def warm(self) -> None:
        """Build the vocabulary indexes now (xgrammar's, and llguidance's when JSON content runs
        there: ~2 s for Qwen3.5), so that no compile's deadline pays for them."""
        self._ensure()
        if WORKER_USES_ENGINE_INTERFACE and json_engine() == LLGUIDANCE:
            engine_llguidance.lltokenizer(self.domain)

    def _ensure(self) -> xgr.GrammarCompiler:
        with self._lock:
            if self._compiler is None:
                self._info = self.domain.tokenizer_info()
                # Our own cache owns reuse; xgrammar's internal one stays off (it is unbounded).
                self._compiler = xgr.GrammarCompiler(self._info, max_threads=1, cache_enabled=False)
            return self._compiler

    def compile(self, constraint: "Compilable", framing: str | None = None, *,
                engine: str | None = None) -> CompileOutcome:
        """Validate, convert and compile under `framing` (default the source's own) on `engine`
        (default: `choose_engine`, or `framed_engine` under another framing; a schema form only
        the xgrammar emission writes and a grammar that could outgrow one of llguidance's
        decode-time limits compile on xgrammar, which has none); single-threaded inside, safe to
        call from many threads.
        Raises the typed RequestErrors of validation."""
        if isinstance(constraint, Framed):
            constraint, framing = constraint.source, constraint.framing
        start = time.perf_counter()
        own = framing is None or framing == framing_of(constraint)
        if engine is None:
            engine = choose_engine(constraint) if own else framed_engine(constraint, framing)
        if engine == LLGUIDANCE and (own and isinstance(constraint, OutputConstraint)
                                     or _has_lark(constraint, framing or framing_of(constraint))):
            from services.grammar.schema.emit import NeedsXgrammar

            try:
                text = build_llguidance_lark(constraint, None if own else framing, self.domain)
                built = LlguidanceConstraint(text, self.domain)
                return CompileOutcome(built, (time.perf_counter() - start) * 1000.0)
            except (NeedsXgrammar, BeyondLimits):  # a form, or a decode-time limit, of llguidance
                engine = XGRAMMAR
        if engine != XGRAMMAR:
            raise InternalError(f"constraint engine {engine!r} cannot build this constraint")
        grammar = build_grammar(constraint, self.domain, framing)
        compiler = self._ensure()
        try:
            compiled = compiler.compile_grammar(grammar)
        except RuntimeError as exc:
            raise InvalidGrammar(f"grammar failed to compile: {exc}") from None
        constraint_ = XgrammarConstraint(compiled, self.domain)
        return CompileOutcome(constraint_, (time.perf_counter() - start) * 1000.0)

    def deserialize(self, text: str) -> CompiledConstraint:
        """A constraint from its `serialize_json` text. Raises InternalError for an unknown tag."""
        if text.startswith(engine_xgrammar.TAG):
            return engine_xgrammar.load(text, self.domain, self.tokenizer_info)
        if text.startswith(engine_llguidance.TAG):
            return engine_llguidance.load(text, self.domain)
        raise InternalError("compiled-constraint blob of an unknown engine")
