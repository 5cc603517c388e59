"""The thinking framing of a model family and the phase decoder that splits output by it.

Design document ("Qwen output phases"): "The reasoning ends at the model's </think> token,
recognized by its id, never by its spelling ... any token except </think> (ExcludeToken), then the
</think> token (Token) and exactly the separator \\n\\n. The close token and the separator are model
framing, not user content; grammar and decoder both recognize them by the same rule, and the content
bytes after the separator publish as generated ... A line break directly before the close token is
framing too (the canonical serialization is \\n</think>\\n\\n) and is not published as reasoning.
Free reasoning cannot reach a different phase in decoder and matcher: </think> spelled with ordinary
tokens is reasoning in both".

- `ThinkingSpec`: a family's framing by spelling (what the grammar service reads from a framing id).
- `ThinkingFraming`: the spec bound to a token domain and tokenizer (ids, the close sequences a
  thinking budget forces).
- `PhaseDecoder`: committed token ids in, `ReasoningDelta` events and content pieces out; the same
  rules with and without a constraint, so free requests split reasoning exactly as constrained ones.
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass
from typing import Sequence

from shared.frontends.pieces import Control
from shared.frontends.token_domain import TokenDomain
from shared.generation import ReasoningDelta

REASONING, CONTENT = "reasoning", "content"
PHASES = (REASONING, CONTENT)


@dataclass(frozen=True)
class ThinkingSpec:
    """A thinking framing by spelling: `open` / `close` control tokens, the byte separator after
    the close token, and the line break before it that belongs to the framing."""

    framing: str  # the id in grammar framings and cache keys
    open: str
    close: str
    separator: bytes = b"\n\n"
    newline: bytes = b"\n"


QWEN_THINK = ThinkingSpec("qwen-think-v1", "<think>", "</think>")
SPECS = {QWEN_THINK.framing: QWEN_THINK}


@dataclass(frozen=True)
class ThinkingFraming:
    """A `ThinkingSpec` bound to one token domain.

    `close_tokens`: the canonical close `\\n</think>\\n\\n` as the model's tokenizer writes it (what
    a thinking budget forces); `close_tokens_after_newline`: `</think>\\n\\n`, forced when the
    reasoning already ends with its line break."""

    spec: ThinkingSpec
    open_id: int
    close_id: int
    close_tokens: tuple[int, ...]
    close_tokens_after_newline: tuple[int, ...]

    @classmethod
    def build(cls, spec: ThinkingSpec, domain: TokenDomain, encode) -> "ThinkingFraming":
        """Bind `spec` to `domain`; `encode(text) -> ids` is the model's tokenizer (special tokens
        spelled in the text map to their ids). Raises ValueError when the domain lacks the
        framing's control tokens or the tokenizer writes the close sequence some other way."""
        try:
            open_id, close_id = domain.special_id(spec.open), domain.special_id(spec.close)
        except KeyError as e:
            raise ValueError(f"the vocabulary has no {e.args[0]!r} token") from None
        if not {open_id, close_id} <= domain.control_ids:
            raise ValueError(f"{spec.open!r} and {spec.close!r} must be control tokens")
        sep = spec.separator.decode()
        full = tuple(encode(spec.newline.decode() + spec.close + sep))
        bare = tuple(encode(spec.close + sep))
        for seq, lead in ((full, spec.newline), (bare, b"")):
            at = seq.index(close_id) if close_id in seq else -1
            ordinary = [t for i, t in enumerate(seq) if i != at]
            if (
                at < 0
                or seq.count(close_id) != 1
                or not all(domain.is_ordinary(t) for t in ordinary)
                or b"".join(domain.token_bytes[t] for t in seq[:at]) != lead
                or b"".join(domain.token_bytes[t] for t in seq[at + 1 :]) != spec.separator
            ):
                raise ValueError(f"the tokenizer writes the thinking close as {list(seq)}")
        return cls(spec, open_id, close_id, full, bare)

    def start_phase(self, prompt_ids: Sequence[int]) -> str:
        """REASONING when the prompt leaves a think block open (its last open token comes after its
        last close token: the generation prompt `<think>\\n`), else CONTENT."""
        last_open = last_close = -1
        for i, t in enumerate(prompt_ids):
            if t == self.open_id:
                last_open = i
            elif t == self.close_id:
                last_close = i
        return REASONING if last_open > last_close else CONTENT

    def forced_close(self, reasoning_tail: bytes = b"") -> tuple[int, ...]:
        """The tokens a thinking budget injects after reasoning that ends with `reasoning_tail`."""
        if reasoning_tail.endswith(self.spec.newline):
            return self.close_tokens_after_newline
        return self.close_tokens


class PhaseDecoder:
    """Splits committed output tokens into reasoning and content (see the module docstring).

    `thinking`: the framing (None: everything is content); `phase`: where the output starts
    (REASONING when the prompt leaves a think block open). `feed(ids)` returns, in order,
    `ReasoningDelta` events and content pieces (`str` for text, `Control` for control tokens) for
    the tool stream or for publication; EOS ids are never text. Text is decoded incrementally:
    an unfinished UTF-8 character is held until it completes, and in reasoning one trailing line
    break is held until the next token shows whether it is the framing before the close token.
    `finish()` flushes what is held (an unfinished character as U+FFFD). With `call_open_id`
    (tools active, the call opener a control token), that token in reasoning ends it as the close
    token does (Qwen3.5 often opens `<tool_call>` inside `<think>`) and starts the content with the
    call, as the tool grammar's reasoning branch allows."""

    def __init__(self, domain: TokenDomain, thinking: ThinkingFraming | None, *,
                 phase: str = CONTENT, call_open_id: int | None = None) -> None:
        if phase not in PHASES:
            raise ValueError(f"phase must be one of {PHASES}, got {phase!r}")
        if phase == REASONING and thinking is None:
            raise ValueError("a reasoning phase needs a thinking framing")
        self.domain = domain
        self.thinking = thinking
        self.phase = phase
        self._reasoning = codecs.getincrementaldecoder("utf-8")("replace")
        self._content = codecs.getincrementaldecoder("utf-8")("replace")
        self._newline_held = False  # reasoning: one trailing line break not yet published
        self._tail = b""  # the last reasoning bytes (for forced_close)
        self._separator = b""  # separator bytes still expected after the close token
        # A tool call's opener token that ends reasoning without the close (None: it is text)
        self.call_open_id = call_open_id

    @property
    def in_reasoning(self) -> bool:
        return self.phase == REASONING

    def forced_close(self) -> tuple[int, ...]:
        """The close sequence a thinking budget injects now (committed with the Program append and
        then fed here like generated tokens); () outside reasoning."""
        if self.phase != REASONING or self.thinking is None:
            return ()
        tail = self.thinking.spec.newline if self._newline_held else self._tail
        return self.thinking.forced_close(tail)

    def feed(self, token_ids: Sequence[int]) -> list:
        out: list = []
        for t in token_ids:
            self._feed_token(int(t), out)
        return out

    def content_text(self, t: int) -> str | None:
        """The text `feed_token(t)` would return as its one piece, for an ordinary ASCII token
        in content with no unfinished character and no separator pending (the commit path's
        common token, read here without the general decoding); None for any other token or
        state, which `feed_token` reads. Returning text means it was read."""
        if self._separator or self.phase != CONTENT or self._content.buffer:
            return None
        table = self.domain.ascii_text
        return table[t] if 0 <= t < len(table) else None

    def feed_token(self, t: int) -> list:
        """`feed((t,))`: the pieces of one token (the commit path reads one token at a time)."""
        out: list = []
        self._feed_token(int(t), out)
        return out

    def _feed_token(self, t: int, out: list) -> None:
        if t in self.domain.eos_ids:
            return
        if self.phase == REASONING:
            self._feed_reasoning(t, out)
        else:
            self._feed_content(t, out)

    def finish(self) -> list:
        """Flush held text at the end of the output."""
        out: list = []
        if self.phase == REASONING:
            text = self._reasoning.decode(b"", final=True)
            if self._newline_held:
                text += self.thinking.spec.newline.decode()
                self._newline_held = False
            if text:
                out.append(ReasoningDelta(text))
        else:
            text = self._content.decode(b"", final=True)
            if text:
                out.append(text)
        return out

    # -- phases --------------------------------------------------------------------------------
    def _feed_reasoning(self, t: int, out: list) -> None:
        thinking = self.thinking
        assert thinking is not None
        if t == thinking.close_id or t == self.call_open_id:
            # The held line break is framing, unless an unfinished character came after it.
            text = self._reasoning.decode(b"", final=True)
            if text and self._newline_held:
                text = thinking.spec.newline.decode() + text
            if text:
                out.append(ReasoningDelta(text))
            self._newline_held = False
            if t == thinking.close_id:
                self.phase, self._separator = CONTENT, thinking.spec.separator
            else:  # an implicit end of reasoning: the call opener is the content's first token
                self.phase, self._separator = CONTENT, b""
                self._feed_content(t, out)
            return
        data = self._bytes(t)
        if data:
            self._tail = (self._tail + data)[-8:]
        text = self._reasoning.decode(data)
        if not text:
            return
        if self._newline_held:
            text = thinking.spec.newline.decode() + text
            self._newline_held = False
        newline = thinking.spec.newline.decode()
        if text.endswith(newline):
            text, self._newline_held = text[: -len(newline)], True
        if text:
            out.append(ReasoningDelta(text))

    def _feed_content(self, t: int, out: list) -> None:
        if t in self.domain.control_ids:
            self._separator = b""
            text = self._content.decode(b"", final=True)
            if text:
                out.append(text)
            out.append(Control(t, self.domain.token_bytes[t].decode("utf-8", "replace")))
            return
        data = self._bytes(t)
        while self._separator and data and data[:1] == self._separator[:1]:
            data, self._separator = data[1:], self._separator[1:]
        if data:
            self._separator = b""  # free output may skip the separator; the grammar never does
        decoder = self._content
        if not decoder.buffer and data.isascii():  # the decoder would return it whole
            text = data.decode("ascii")
        else:
            text = decoder.decode(data)
        if text:
            out.append(text)

    def _bytes(self, t: int) -> bytes:
        domain = self.domain
        if t in domain.control_ids:  # a control token inside free reasoning: its spelling
            return domain.token_bytes[t]
        if 0 <= t < len(domain.token_bytes):
            return domain.token_bytes[t]
        return b""
