"""Request preparation on the caller's event loop: option checks, the output language (a tool
grammar, a content constraint or none) and the request's OutputSession.

This is the one place where a request's output language is decided; the Engine calls it from
`submit`, before the request joins the queue, so every request error raises before any event.
"""

from __future__ import annotations

import asyncio

from services.grammar.client import GrammarClient
from services.grammar.tools import ToolSpec, needs_tool_grammar
from services.worker.output_session import OutputSession
from services.worker.runtime import ModelRuntime, PreparedPrompt
from services.worker.tool_stream import ToolStream
from shared.contract import ToolMode, validate_tools
from shared.errors import ConflictingConstraint, ConstraintDeadEnd, InvalidRequest, Unsupported
from shared.frontends.token_domain import TokenDomain
from shared.generation import GenerateRequest


def check_options(request: GenerateRequest, domain: TokenDomain) -> ToolSpec | None:
    """Reject bad option combinations; returns the tool spec when a tool grammar applies.

    Raises InvalidToolDefinition / InvalidRequest (tools, tool_choice, stop_token_ids),
    Unsupported (tools with a raw text prompt), ConflictingConstraint (stop strings or stop ids
    with a constrained output, a GBNF/regex/choice constraint with active tools)."""
    options, prompt = request.options, request.prompt
    tool_spec = None
    if prompt.tools:
        validate_tools(prompt.tools, options.tool_choice)
        if prompt.text is not None and options.tool_choice.mode is not ToolMode.NONE:
            raise Unsupported("tools need chat messages; a raw text prompt has no tool framing",
                              field="tools")
        if needs_tool_grammar(prompt.tools, options.tool_choice, options.constraint):
            tool_spec = ToolSpec(prompt.tools, options.tool_choice, options.constraint)
    if options.constraint is not None or tool_spec is not None:
        for name in ("stop", "stop_token_ids"):
            if getattr(options, name):
                raise ConflictingConstraint(
                    f"{name} cannot be combined with an output constraint: constrained output "
                    "ends where its language ends", field=name)
    for t in options.stop_token_ids:
        if not 0 <= t < domain.size:
            raise InvalidRequest(f"stop token id {t} is outside the vocabulary "
                                 f"[0, {domain.size})", field="stop_token_ids")
    return tool_spec


def tool_stream_for(request: GenerateRequest, tool_spec: ToolSpec | None) -> ToolStream | None:
    """The call decoder: constrained with a tool grammar, free when tools are declared but
    nothing is enforced, absent without active tools."""
    if tool_spec is not None:
        # With a JSON union the decoder still reads calls; JSON content has no opener.
        return ToolStream(constrained=True)
    prompt = request.prompt
    if prompt.tools and request.options.tool_choice.mode is not ToolMode.NONE:
        return ToolStream(constrained=False)
    return None


def constraint_kind(request: GenerateRequest, tool_spec: ToolSpec | None) -> str:
    """The metrics label of a request's output language."""
    if tool_spec is not None:
        return "tools"
    constraint = request.options.constraint
    return constraint.kind.value if constraint is not None else "none"


async def build_output_session(request: GenerateRequest, prepared: PreparedPrompt,
                               max_new_tokens: int, tool_spec: ToolSpec | None, *,
                               runtime: ModelRuntime, grammar: GrammarClient) -> OutputSession:
    """The request's OutputSession: a tool grammar (tools active), else the content constraint,
    else none. Compiles through the GrammarClient; raises its typed errors, and
    ConstraintDeadEnd when nothing is legal at the first position."""
    domain = runtime.domain
    constraint = tool_spec if tool_spec is not None else request.options.constraint
    if constraint is None:
        return OutputSession(domain, None, max_new_tokens=max_new_tokens)
    result = await grammar.compile(constraint, model=runtime.name)
    compiled = result.grammar
    stats = result.stats

    def make() -> OutputSession:
        session = OutputSession(domain, compiled, prefix=prepared.prefix,
                                max_new_tokens=max_new_tokens, cache=stats.hit,
                                built=stats.built, waited=stats.waited,
                                compile_ms=stats.compile_ms,
                                branch="undecided" if tool_spec is not None else "content")
        if not (session.may_end or session.can_continue):
            raise ConstraintDeadEnd("the constraint allows no token at output position 0",
                                    position=0)
        return session

    return await asyncio.to_thread(make)
