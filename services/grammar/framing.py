"""Output framings: the model's framing around a content constraint or a tool grammar.

A framing id (shared/frontends/frontend.py) names the inner language's framing ("raw" for a
content constraint, a tool format's framing for a tool spec) and, when the output starts in
reasoning, the thinking framing before it ("qwen-think-v1+qwen-xml-v1"). The framing is part of
the compiled grammar's cache key; the compile request carries it.

The thinking prefix (design document, "Qwen output phases"): "The grammar's reasoning branch is
token-level: any token except </think> (ExcludeToken), then the </think> token (Token) and exactly
the separator \\n\\n", and "an early EOS inside that reasoning branch must be prevented". Reasoning
is one `ExcludeToken(...)` of the close token, the EOS ids and every other control token, so a
reasoning token is an ordinary token (xgrammar 0.2.8 masks `ExcludeToken(a) | ExcludeToken(b)` as
their intersection, so the ids go in one terminal); the separator is a byte literal matched after
the close token, so a token holding the separator's end and the content's start is legal. The
thinking framing wraps the whole inner language, the union of JSON content and calls included;
around an XML tool grammar that may call, the reasoning may also end at once with a call (its
opener is a control token no reasoning token is: an implicit end of reasoning, as Qwen3.5 writes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

import xgrammar as xgr

from services.grammar.regex.tree import ebnf_literal
from shared.contract import OutputConstraint, ToolMode
from shared.errors import InternalError, Unsupported
from shared.frontends.formats import FORMATS, HERMES, QWEN_XML
from shared.frontends.frontend import RAW_FRAMING, split_framing
from shared.frontends.thinking import SPECS, ThinkingSpec
from shared.frontends.token_domain import TokenDomain

if TYPE_CHECKING:
    from services.grammar.tools import ToolSpec

Compilable = Union[OutputConstraint, "ToolSpec"]


def default_framing(constraint: Compilable) -> str:
    """The framing a source compiles under when none is given: raw content, or Hermes tools."""
    return RAW_FRAMING if isinstance(constraint, OutputConstraint) else HERMES.framing


def check_framing(constraint: Compilable, framing: str) -> None:
    """Raise Unsupported(field="framing") unless `framing` is known and fits the source kind
    (a content constraint: "raw" inside; a tool spec: a tool format inside)."""
    thinking, inner = split_framing(framing)
    if thinking is not None and thinking not in SPECS:
        raise Unsupported(f"unknown thinking framing {thinking!r} in {framing!r}; known: "
                          f"{', '.join(SPECS)}", field="framing")
    content = isinstance(constraint, OutputConstraint)
    if content and inner != RAW_FRAMING:
        raise Unsupported(f"framing {framing!r} does not fit a content constraint; its inner "
                          f"framing must be {RAW_FRAMING!r}", field="framing")
    if not content and inner not in FORMATS:
        raise Unsupported(f"framing {framing!r} does not fit a tool spec; its inner framing must "
                          f"be one of {', '.join(FORMATS)}", field="framing")


def thinking_prefix_ebnf(spec: ThinkingSpec, domain: TokenDomain) -> str:
    """EBNF (entry `root`) of reasoning, the close token and the separator over `domain`.
    Raises Unsupported(field="framing") when the vocabulary lacks the framing's tokens."""
    try:
        close = domain.special_id(spec.close)
    except KeyError:
        raise Unsupported(f"the vocabulary {domain.name!r} has no {spec.close!r} token for the "
                          f"thinking framing {spec.framing!r}", field="framing") from None
    if close not in domain.control_ids:
        raise InternalError(f"{spec.close!r} is not a control token of {domain.name!r}")
    excluded = sorted({close} | domain.eos_ids | domain.control_ids)
    return (f"root ::= reasoning Token({close}) {ebnf_literal(spec.separator.decode())}\n"
            f"reasoning ::= \"\" | ExcludeToken({', '.join(map(str, excluded))}) reasoning\n")


def inner_grammar(constraint: Compilable, inner: str, domain: TokenDomain) -> xgr.Grammar:
    """The language inside the framing: the content constraint, or the tool grammar of the
    format `inner`."""
    from services.grammar.compiler import build_grammar

    if isinstance(constraint, OutputConstraint) or inner == HERMES.framing:
        return build_grammar(constraint, domain)
    from services.grammar.xml_tools import xml_tool_grammar_ebnf

    try:
        text = xml_tool_grammar_ebnf(constraint, domain)
    except ValueError as e:  # the vocabulary lacks the format's control tokens
        raise Unsupported(f"the XML tool format needs {e}", field="framing") from None
    try:
        return xgr.Grammar.from_ebnf(text)
    except RuntimeError as exc:  # our conversion produced text xgrammar refuses: our bug
        raise InternalError(f"converted XML tool grammar did not parse: {exc}") from None


def _implicit_close_ebnf(spec: ThinkingSpec, constraint: "ToolSpec", domain: TokenDomain) -> str:
    """The thinking framing around an XML tool grammar that may call: reasoning, then either the
    close token, the separator and the tool language, or at once the call sequence. Qwen3.5 often
    opens `<tool_call>` inside `<think>` without closing it; the opener is a control token no
    reasoning token is, so it ends the reasoning implicitly (the PhaseDecoder reads it so)."""
    from services.grammar.tools import embed
    from services.grammar.xml_tools import xml_tool_grammar_ebnf

    prefix = thinking_prefix_ebnf(spec, domain)  # validates the close token
    head, reasoning = prefix.split("\n", 1)
    try:
        text = xml_tool_grammar_ebnf(constraint, domain)
    except ValueError as e:  # the vocabulary lacks the format's control tokens
        raise Unsupported(f"the XML tool format needs {e}", field="framing") from None
    body, root = embed(text, "x_")
    closed = head.removeprefix("root ::= ")
    return f"root ::= {closed} {root} | reasoning x_calls\n{reasoning}{body}"


def build_framed_grammar(constraint: Compilable, framing: str, domain: TokenDomain) -> xgr.Grammar:
    """The grammar of `constraint` under `framing` for `domain`. Raises Unsupported for a framing
    that does not fit and the inner conversion's typed errors."""
    check_framing(constraint, framing)
    thinking, inner = split_framing(framing)
    if thinking is not None and inner == QWEN_XML.framing \
            and constraint.choice.mode is not ToolMode.NONE:
        text = _implicit_close_ebnf(SPECS[thinking], constraint, domain)
        try:
            return xgr.Grammar.from_ebnf(text)
        except RuntimeError as exc:  # our conversion produced text xgrammar refuses: our bug
            raise InternalError(f"framed XML tool grammar did not parse: {exc}") from None
    grammar = inner_grammar(constraint, inner, domain)
    if thinking is None:
        return grammar
    prefix = xgr.Grammar.from_ebnf(thinking_prefix_ebnf(SPECS[thinking], domain))
    return xgr.Grammar.concat(prefix, grammar)
