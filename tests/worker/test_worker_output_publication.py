"""The publication decoder (services/worker/output/publication.py) on its own: the phase decoder's
reasoning and content, stop strings on the content only, control tokens in order with held
stop-string text, and a continued prefix that is read but never published."""

from __future__ import annotations

from bench.random_weights import ByteTokenizer
from services.worker.output.publication import Publication
from services.worker.output.stop_strings import StopStrings
from shared.frontends.formats.qwen_xml_stream import ToolStream
from shared.frontends.thinking import CONTENT, QWEN_THINK, REASONING, PhaseDecoder, ThinkingFraming
from shared.generation import ReasoningDelta, TextDelta, ToolCallArgumentsDelta, ToolCallStart
from tests.support.qwen_support import xml_domain

DOMAIN = xml_domain()
ENCODE = ByteTokenizer(DOMAIN).encode
THINKING = ThinkingFraming.build(QWEN_THINK, DOMAIN, ENCODE)


def publication(phase: str = REASONING, **kw) -> Publication:
    return Publication(PhaseDecoder(DOMAIN, THINKING, phase=phase), **kw)


def test_stop_strings_cut_content_never_reasoning():
    """Design: the close token and separator are framing; stop strings are the content's. A stop
    string inside the reasoning does not stop the output; in the content it does, unpublished."""
    out = publication(stop=StopStrings(("END",)))
    events = out.feed(ENCODE("I say END here\n</think>\n\nok END more"))
    assert [type(e) for e in events].count(ReasoningDelta) >= 1
    assert out.reasoning() == "I say END here" and out.content() == "ok " and out.stopped
    assert out.reasoning_tokens == len(ENCODE("I say END here\n</think>"))
    assert not any(isinstance(e, TextDelta) and "END" in e.text for e in events)


def test_control_token_without_a_tool_stream_displays_as_spelled_in_order():
    out = publication(CONTENT, stop=StopStrings(("<x",)))
    events = out.feed(ENCODE("a<<tool_call>b"))
    events += out.finish(complete=True)
    assert "".join(e.text for e in events) == out.content() == "a<<tool_call>b"


def test_a_continued_prefix_is_read_but_not_published():
    """ContinueFinalAssistant: the prefix's content is not published again; the head of the call
    it leaves unfinished goes out first, so fragments concatenate to the call's arguments."""
    out = publication(CONTENT, tools=ToolStream(constrained=True))
    out.continue_from(ENCODE("Hi.\n\n<tool_call>\n<function=f>\n<parameter=a>\nx"))
    events = out.feed(ENCODE("y\n</parameter>\n</function>\n</tool_call>"))
    events += out.finish(complete=True)
    assert out.content() == "" and not any(isinstance(e, TextDelta) for e in events)
    assert isinstance(events[0], ToolCallStart) and events[0].name == "f"
    (call,) = out.tool_calls()
    assert "".join(e.fragment for e in events if isinstance(e, ToolCallArgumentsDelta)) == \
        call.arguments_json == '{"a": "xy"}'


def test_utf8_held_back_across_tokens():
    """"incomplete UTF-8 at a token boundary is held back until complete"; "EOS is not published
    as text"; a cut inside a character ends the display with U+FFFD (an incomplete result)."""
    target = "\u65e5\u00e9!"  # e6 97 a5, c3 a9, 21
    out = publication(CONTENT)
    eos = min(DOMAIN.eos_ids)
    deltas = ["".join(e.text for e in out.feed([t]) if isinstance(e, TextDelta))
              for t in ENCODE(target) + [eos]]
    assert deltas == ["", "", "\u65e5", "", "\u00e9", "!", ""]
    assert out.content() == target
    cut = publication(CONTENT)
    cut.feed(ENCODE("\u65e5")[:2])
    assert cut.content() == ""
    cut.finish(complete=False)
    assert cut.content() == "\ufffd"


def test_an_unfinished_character_before_ascii_text_is_replaced_in_order():
    """A character cut by plain text (free output may produce it) displays as U+FFFD before
    that text, never after it nor dropped: the held bytes go first even when the new token is
    ASCII."""
    out = publication(CONTENT)
    events = out.feed(ENCODE("\u65e5")[:1]) + out.feed(ENCODE("ab"))
    assert [e.text for e in events] == ["\ufffda", "b"] and out.content() == "\ufffdab"
