"""Each tool format owns what differs between formats (shared/frontends/formats/__init__.py): its
value codings, its argument-name constraint and a stream that keeps the one ToolStream protocol
the worker's publication reads, so request preparation names no format."""

from __future__ import annotations

import pytest

from shared.frontends.formats import FORMATS, HERMES, QWEN_XML, ToolStream, qwen_xml


@pytest.mark.parametrize("fmt", list(FORMATS.values()), ids=list(FORMATS))
@pytest.mark.parametrize("constrained", [True, False])
def test_every_format_stream_keeps_the_protocol(fmt, constrained):
    stream = fmt.stream(constrained=constrained, codings=None)
    assert isinstance(stream, ToolStream) and stream.constrained is constrained
    assert stream.feed("plain text") is not None
    stream.finish(complete=True)
    assert stream.tool_calls() == () and stream.text() == "plain text"


def test_the_formats_state_their_differences():
    """Hermes arguments are one JSON object (no codings, no name constraint); Qwen XML values are
    bare text decoded by the declared parameters, and its argument names are guarded between the
    call's control tokens."""
    assert not HERMES.coded_arguments and HERMES.name_guard is None
    assert QWEN_XML.coded_arguments
    assert QWEN_XML.name_guard == (qwen_xml.CALL_OPEN, qwen_xml.CALL_CLOSE)
