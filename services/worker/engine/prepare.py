"""Request preparation on the caller's event loop: `prepare(request) -> Request`.

The one place where a request's output language is decided (a tool grammar, a content constraint
or none): it checks the options, renders and tokenizes the prompt through the model's Frontend,
compiles the constraint through the GrammarClient (cold compiles happen here, never on the worker
thread) and builds the request's OutputSession. Every request error raises here, before the
request joins the queue and before any event.
"""

from __future__ import annotations

import asyncio
import secrets
import time

from services.grammar.client import (
    GrammarClient,
    LengthIndex,
    NameIndex,
    ParameterNameConstraint,
    RawLengthConstraint,
    ToolSpec,
    argument_codings,
    counted_lengths,
    json_lengths_for,
    json_names_for,
    needs_tool_grammar,
    tool_json_names_for,
    unique_items_for,
)
from services.worker.output.publication import Publication
from services.worker.output.session import OutputSession
from services.worker.output.stop_strings import StopStrings
from services.worker.request import Request
from services.worker.runtime import ModelRuntime, resolve_sampling
from shared.contract import ToolMode, validate_tools
from shared.errors import ConflictingConstraint, ConstraintDeadEnd, InvalidRequest, Unsupported
from shared.frontends.formats import ToolStream
from shared.frontends.frontend import Frontend, PreparedPrompt
from shared.frontends.thinking import REASONING
from shared.generation import GenerateRequest


async def prepare(request: GenerateRequest, *, runtime: ModelRuntime, grammar: GrammarClient,
                  max_len: int, submitted: float, sink) -> Request:
    """Check, render, compile and build the OutputSession of `request` for lanes of `max_len`
    positions; returns the waiting Request (its events go to `sink`: request.py), whose output
    budget is max_tokens or, none given, what the lane holds after the prompt.

    Raises (before any event) InvalidRequest (model, prompt, max_tokens beyond the context,
    stop_token_ids),
    ConflictingConstraint (`stop` / `stop_token_ids` with a constraint), Unsupported (tools with a
    raw text prompt), the grammar service's InvalidSchema / InvalidGrammar / ..., and
    ConstraintDeadEnd (nothing legal at the first position)."""
    options = request.options
    if request.model != runtime.name:
        raise InvalidRequest(f"model {request.model!r} is not served here; expected "
                             f"{runtime.name!r}", field="model")
    tool_spec = check_options(request, runtime.frontend)
    prompt = await asyncio.to_thread(runtime.prepare, request.prompt)
    input_done = time.monotonic()
    room = max_len - len(prompt.token_ids) + 1
    if room < 1:
        raise InvalidRequest(f"the prompt has {len(prompt.token_ids)} tokens; a lane holds "
                             f"{max_len}", field="prompt")
    if options.max_tokens is not None and options.max_tokens > room:
        raise InvalidRequest(
            f"max_tokens is {options.max_tokens}, but the prompt has {len(prompt.token_ids)} "
            f"tokens and the context holds {max_len}: at most {room} output tokens fit",
            field="max_tokens")
    budget = options.max_tokens or room
    # Off the loop: a strict XML tool's value coding reduces its schema, as its grammar does.
    tools = await asyncio.to_thread(_tool_stream, request, tool_spec, runtime)
    # With tools active a continued assistant message is read as tokens: a tool grammar is
    # token-level in its free text and call openers (a spelled opener is its token; a completed
    # call in the prefix is refused there), and the decoder reads the call it leaves open.
    prefix_tokens = runtime.frontend.continuation_tokens(prompt.prefix) \
        if prompt.prefix and tools is not None else ()
    session = await _output_session(request, prompt, tool_spec, prefix_tokens, runtime=runtime,
                                    grammar=grammar)
    constrained = session.constrained
    seed = options.sampling.seed
    output = Publication(runtime.frontend.phase_decoder(prompt.phase, calls=tools is not None),
                         stop=StopStrings(options.stop) if options.stop else None, tools=tools)
    if prefix_tokens:
        output.continue_from(prefix_tokens)
    return Request(
        request_id=request.request_id, prompt_ids=prompt.token_ids, session=session, sink=sink,
        max_new_tokens=budget,
        sampling=resolve_sampling(options.sampling, runtime.defaults, constrained),
        seed=seed if seed is not None else secrets.randbits(63), output=output,
        stop_token_ids=frozenset(options.stop_token_ids),
        thinking_budget=options.thinking_budget if prompt.phase == REASONING else None,
        logprobs=options.logprobs,
        constraint_kind=_constraint_kind(request, tool_spec),
        deadline=submitted + options.timeout_s if options.timeout_s else None,
        timeout_s=options.timeout_s, submitted_at=submitted,
        input_seconds=input_done - submitted, constraint_seconds=time.monotonic() - input_done)


def check_options(request: GenerateRequest, frontend: Frontend) -> ToolSpec | None:
    """Reject bad option combinations; returns the tool spec when a tool grammar applies (the
    model's tool format decides whether `none` is a grammar: a control-token opener can be
    forbidden, a text opener cannot).

    Raises InvalidToolDefinition / InvalidRequest (tools, tool_choice, stop_token_ids),
    Unsupported (tools with a raw text prompt, thinking asked of a model without it),
    ConflictingConstraint (stop strings or stop ids with a constrained output, a
    GBNF/regex/choice constraint with active tools)."""
    options, prompt = request.options, request.prompt
    if frontend.thinking is None:  # the control would change nothing: refused, never ignored
        for name, asked in (("thinking_budget", options.thinking_budget is not None),
                            ("enable_thinking", prompt.enable_thinking is True)):
            if asked:
                raise Unsupported(f"model {frontend.name!r} has no thinking mode: a thinking or "
                                  "reasoning setting cannot apply to it", field=name)
    domain = frontend.domain
    tool_spec = None
    if prompt.tools:
        validate_tools(prompt.tools, options.tool_choice)
        if prompt.messages is None and options.tool_choice.mode is not ToolMode.NONE:
            raise Unsupported("tools need chat messages; a raw text prompt has no tool framing",
                              field="tools")
        if needs_tool_grammar(prompt.tools, options.tool_choice, options.constraint,
                              opener_is_token=frontend.tool_format.opener_is_token):
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


def _tool_stream(request: GenerateRequest, tool_spec: ToolSpec | None,
                 runtime: ModelRuntime) -> ToolStream | None:
    """The call decoder of the model's tool format: constrained with a tool grammar, free when
    tools are declared but nothing is enforced, absent without active tools."""
    fmt = runtime.frontend.tool_format
    if tool_spec is not None:
        # The value contract the grammar was built from. With a JSON union (content OR calls) a
        # call opens only at the start of the output.
        codings = argument_codings(tool_spec.allowed(), forced=tool_spec.forced) \
            if fmt.coded_arguments else None
        return fmt.stream(constrained=True, codings=codings, union=tool_spec.content is not None)
    prompt = request.prompt
    if prompt.tools and request.options.tool_choice.mode is not ToolMode.NONE:
        codings = argument_codings(prompt.tools) if fmt.coded_arguments else None
        return fmt.stream(constrained=False, codings=codings)
    return None


def _name_constraint(tool_spec: ToolSpec | None,
                     frontend: Frontend) -> ParameterNameConstraint | None:
    """The ParameterNameConstraint companion of a tool grammar whose format guards argument
    names (`ToolFormat.name_guard`) with a non-strict tool that can be called (design document:
    it "runs only when a non-strict tool is declared"; strict arguments follow their declared
    order, which forbids repeats already)."""
    guard = frontend.tool_format.name_guard
    if tool_spec is None or guard is None or tool_spec.choice.mode is ToolMode.NONE \
            or all(t.strict for t in tool_spec.allowed()):
        return None
    domain = frontend.domain
    opener, closer = guard
    return ParameterNameConstraint(NameIndex.of(domain), domain.special_id(opener),
                                   domain.special_id(closer))


def _length_constraint(tool_spec: ToolSpec | None,
                       frontend: Frontend) -> RawLengthConstraint | None:
    """The RawLengthConstraint companion of an XML tool grammar that leaves raw string length
    bounds to it (xml_tools.counted_lengths, from the same tool spec as the grammar): without it
    the grammar alone would let a value overrun its bounds."""
    fmt = frontend.tool_format
    if tool_spec is None or not fmt.coded_arguments or fmt.name_guard is None \
            or tool_spec.choice.mode is ToolMode.NONE:
        return None
    bounds = counted_lengths(tool_spec.allowed(), forced=tool_spec.forced)
    if not bounds:
        return None
    domain = frontend.domain
    opener, closer = fmt.name_guard
    return RawLengthConstraint(LengthIndex.of(domain), domain.special_id(opener),
                               domain.special_id(closer), bounds)


def _constraint_kind(request: GenerateRequest, tool_spec: ToolSpec | None) -> str:
    """The metrics label of a request's output language."""
    if tool_spec is not None:
        return "tools"
    constraint = request.options.constraint
    return constraint.kind.value if constraint is not None else "none"


async def _output_session(request: GenerateRequest, prompt: PreparedPrompt,
                          tool_spec: ToolSpec | None, prefix_tokens: tuple[int, ...], *,
                          runtime: ModelRuntime, grammar: GrammarClient) -> OutputSession:
    """A tool grammar (tools active), else the content constraint, else none. Raises the
    GrammarClient's typed errors, and ConstraintDeadEnd when nothing is legal at position 0."""
    domain, frontend = runtime.domain, runtime.frontend
    constraint = tool_spec if tool_spec is not None else request.options.constraint
    if constraint is None:
        return OutputSession(domain, None)
    framing = frontend.output_framing(prompt.phase, tools=tool_spec is not None)
    result = await grammar.compile(constraint, model=runtime.name, framing=framing)
    compiled = result.grammar
    stats = result.stats

    def make() -> OutputSession:
        session = OutputSession(domain, compiled, prefix=prompt.prefix, cache=stats.hit,
                                prefix_tokens=prefix_tokens if tool_spec is not None else (),
                                built=stats.built, waited=stats.waited,
                                compile_ms=stats.compile_ms,
                                branch="undecided" if tool_spec is not None else "content",
                                names=(_name_constraint(tool_spec, frontend),
                                       tool_json_names_for(tool_spec, domain, framing))
                                if tool_spec is not None
                                else json_names_for(constraint, domain, framing),
                                lengths=_length_constraint(tool_spec, frontend) if tool_spec
                                is not None else json_lengths_for(constraint, domain, framing),
                                items=None if tool_spec is not None else
                                unique_items_for(constraint, domain, framing))
        if not (session.may_end or session.can_continue):
            raise ConstraintDeadEnd("the constraint allows no token at output position 0",
                                    position=0)
        return session

    return await asyncio.to_thread(make)
