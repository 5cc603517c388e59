"""ContinueFinalAssistant for Qwen3.5, end to end on the real vocabulary: the Frontend renders the
prompt and gives the continued content; a content constraint's matcher accepts it as bytes, a tool
grammar's as tokens; only the new suffix is generated and completeness covers prefix + suffix.

Design document: "Content constraints accept the prefix as bytes. A tool grammar is token-level in
its free text and call openers, so the Frontend gives it the prefix as tokens: each <tool_call>
the client spelled as the <tool_call> token (the decoder likewise reads it as the opener the
prefix continues), every other byte as its byte-level token"; "Completeness covers "provided
content + new suffix": a prefix {"name": and a suffix "Shanghai"} form a complete object without
the suffix being JSON on its own"; "A continuation may advance to the first unfinished call".
"""

from __future__ import annotations

import json

import xgrammar as xgr

from services.grammar.compiler import build_framed_grammar
from services.grammar.engines.engine_xgrammar import XgrammarConstraint
from services.grammar.tools.hermes import ToolSpec
from services.grammar.tools.xml_tools import argument_codings
from services.worker.output.session import OutputSession
from shared.contract import OutputConstraint, ToolChoice, ToolDefinition
from shared.frontends import get_frontend
from shared.frontends.formats.qwen_xml_stream import ToolStream
from shared.frontends.thinking import CONTENT
from shared.generation import ChatMessage, PromptInput, ToolCallArgumentsDelta
from tests.support.qwen_support import ordinary_ids, qwen_compiler

LOOKUP = ToolDefinition.create("lookup", {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"],
    "additionalProperties": False}, strict=True)


def _continued(content: str, tools=()) -> PromptInput:
    return PromptInput(
        messages=(ChatMessage("user", "Weather?"), ChatMessage("assistant", content)),
        tools=tools,
        continue_final_assistant=True,
    )


def test_content_prefix_as_bytes() -> None:
    """A JSON prefix `{"name":` continued by `"Shanghai"}`: the suffix alone is not JSON, the
    whole is; the output starts in content (no thinking framing)."""
    frontend = get_frontend("qwen3.5")
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"],
              "additionalProperties": False}
    prepared = frontend.prepare(_continued('{"name":'))
    assert prepared.phase == CONTENT and prepared.prefix == b'{"name":'
    framing = frontend.output_framing(prepared.phase, tools=False)
    compiled = qwen_compiler().compile_grammar(build_framed_grammar(
        OutputConstraint.json_schema(schema), framing, frontend.domain))
    session = OutputSession(frontend.domain, XgrammarConstraint(compiled, frontend.domain),
                            prefix=prepared.prefix)
    suffix = ordinary_ids(' "Shanghai"}')
    result = session.preview(suffix + [min(frontend.domain.eos_ids)])
    session.confirm()
    assert result.terminated and result.accepted == len(suffix) + 1
    text = b"".join(frontend.domain.token_bytes[t] for t in suffix).decode()
    assert json.loads(prepared.prefix.decode() + text) == {"name": "Shanghai"}


def test_tool_prefix_as_tokens_continues_the_unfinished_call() -> None:
    """A prefix with content and an unfinished call: the tool grammar's matcher accepts it as
    tokens (the spelled opener as its token), the decoder reads the call from the prefix, and the
    suffix completes arguments that validate."""
    frontend = get_frontend("qwen3.5")
    text = "Let me check.\n\n<tool_call>\n<function=lookup>\n<parameter=city>\nPar"
    prepared = frontend.prepare(_continued(text, (LOOKUP,)))
    assert prepared.phase == CONTENT and prepared.prefix == text.encode()
    spec = ToolSpec((LOOKUP,), ToolChoice())
    framing = frontend.output_framing(prepared.phase, tools=True)
    assert framing == "qwen-xml-v1"
    compiled = qwen_compiler().compile_grammar(build_framed_grammar(spec, framing,
                                                                    frontend.domain))
    matcher = xgr.GrammarMatcher(compiled)
    prefix_tokens = frontend.continuation_tokens(prepared.prefix)
    assert all(matcher.accept_token(t) for t in prefix_tokens)
    closer = frontend.domain.special_id("</tool_call>")
    suffix = ordinary_ids("is\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n") \
        + [closer]
    assert all(matcher.accept_token(t) for t in suffix) and matcher.is_completed()

    decoder = frontend.phase_decoder(prepared.phase)
    stream = ToolStream(constrained=True, codings=argument_codings((LOOKUP,)))
    prefix_events = [e for p in decoder.feed(prefix_tokens) for e in stream.feed(p)]
    events = [e for p in decoder.feed(suffix) + decoder.finish() for e in stream.feed(p)]
    events += stream.finish(complete=True)
    (call,) = stream.tool_calls()
    assert json.loads(call.arguments_json) == {"city": "Paris", "days": 2}
    fragments = [e.fragment for e in prefix_events + events
                 if isinstance(e, ToolCallArgumentsDelta)]
    assert "".join(fragments) == call.arguments_json
    assert stream.text() == "Let me check."
