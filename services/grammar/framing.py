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
opener is a control token no reasoning token is: an implicit end of reasoning, as Qwen3.5 writes;
`implicit_close_ebnf`). JSON content after the thinking framing runs on llguidance
(`thinking_prefix_lark`: the same prefix over token-id sets; the rule is
`services.grammar.compiler.framed_engine`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Union

from services.grammar.engines.lark import lark_literal
from services.grammar.regex.tree import ebnf_literal
from shared.contract import OutputConstraint, ToolMode
from shared.errors import InternalError, Unsupported
from shared.frontends.formats import FORMATS, HERMES, QWEN_XML
from shared.frontends.frontend import RAW_FRAMING, split_framing
from shared.frontends.thinking import SPECS, ThinkingSpec
from shared.frontends.token_domain import TokenDomain

if TYPE_CHECKING:
    from services.grammar.tools.hermes import ToolSpec

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


def _close_id(spec: ThinkingSpec, domain: TokenDomain) -> int:
    try:
        close = domain.special_id(spec.close)
    except KeyError:
        raise Unsupported(f"the vocabulary {domain.name!r} has no {spec.close!r} token for the "
                          f"thinking framing {spec.framing!r}", field="framing") from None
    if close not in domain.control_ids:
        raise InternalError(f"{spec.close!r} is not a control token of {domain.name!r}")
    return close


def thinking_prefix_ebnf(spec: ThinkingSpec, domain: TokenDomain) -> str:
    """EBNF (entry `root`) of reasoning, the close token and the separator over `domain`.
    Raises Unsupported(field="framing") when the vocabulary lacks the framing's tokens."""
    close = _close_id(spec, domain)
    excluded = sorted({close} | domain.eos_ids | domain.control_ids)
    return (f"root ::= reasoning Token({close}) {ebnf_literal(spec.separator.decode())}\n"
            f"reasoning ::= \"\" | ExcludeToken({', '.join(map(str, excluded))}) reasoning\n")


def implicit_close_applies(constraint: Compilable, thinking: str | None, inner: str) -> bool:
    """Whether the output may leave its reasoning by opening a call: an XML tool grammar (its
    opener a control token) that may call, after a thinking framing."""
    return thinking is not None and inner == QWEN_XML.framing \
        and not isinstance(constraint, OutputConstraint) \
        and constraint.choice.mode is not ToolMode.NONE


def implicit_close_ebnf(spec: ThinkingSpec, tool_ebnf: str, domain: TokenDomain) -> str:
    """The thinking framing around an XML tool grammar (`tool_ebnf`, entry `root`, with its call
    sequence `calls`): reasoning, then either the close token, the separator and the tool
    language, or at once the call sequence. Qwen3.5 often opens `<tool_call>` inside `<think>`
    without closing it (vLLM reads the opener as an implicit end of reasoning, and so does the
    PhaseDecoder). Raises Unsupported(field="framing") as `thinking_prefix_ebnf` does."""
    from services.grammar.tools.hermes import embed

    head, reasoning = thinking_prefix_ebnf(spec, domain).split("\n", 1)
    body, root = embed(tool_ebnf, "x_")
    closed = head.removeprefix("root ::= ")
    return f"root ::= {closed} {root} | reasoning x_calls\n{reasoning}{body}"


def _id_ranges(ids: list[int]) -> str:
    """Sorted ids as llguidance's token-set list: "3,7-9,12"."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in ids[1:] + [None]:  # type: ignore[list-item]
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def thinking_prefix_lark(spec: ThinkingSpec, domain: TokenDomain, content: str) -> str:
    """llguidance Lark of the thinking framing around `content` (Lark text with entry `start`):
    the language of `thinking_prefix_ebnf` followed by the content. Reasoning is any ordinary
    token (every special id and padding row excluded by id: llguidance's `<[^...]>` covers the
    whole id range, where xgrammar never matches special or padding ids by bytes), then the close
    token, then the separator as bytes. Raises Unsupported(field="framing") as
    `thinking_prefix_ebnf` does."""
    close = _close_id(spec, domain)
    special = sorted(domain.special_ids | set(range(len(domain.token_bytes), domain.size)))
    lines = content.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("start: "))
    root = lines[at].removeprefix("start: ")
    sep = lark_literal(spec.separator.decode())
    lines[at] = f"start: thinking_reasoning <[{close}]> {sep} {root}"
    lines.insert(at + 1, f"thinking_reasoning: <[^{_id_ranges(special)}]>*")
    return "\n".join(lines)
