"""The Frontend of a Hugging Face checkpoint directory: token domain, tokenizer and chat rendering
read from the checkpoint's own files (config.json, generation_config.json, tokenizer.json,
tokenizer_config.json, chat_template.jinja).

Special-token classes come only from the files' explicit flags, never from spellings:

- EOS ids: `eos_token_id` of generation_config.json and of config.json (an int or a list) and
  tokenizer_config.json's `eos_token` (a spelling or an AddedToken dictionary), together;
- control ids: every other added token marked `special: true` in tokenizer.json;
- never ids: embedding rows past the tokenizer's vocabulary (config.json `vocab_size` counts the
  logits) and ids inside it that no token uses.

Ordinary token bytes: byte-level BPE vocabularies (a `ByteLevel` decoder or pre-tokenizer) spell
bytes through GPT-2's printable table; SentencePiece-style vocabularies (a `ByteFallback`,
`Metaspace` or `Replace("▁", " ")` decoder) spell a space as `▁` and a raw byte as `<0xNN>`. A
SentencePiece decoder's `Strip` of the first leading space is a display rule for the start of a
text and is not applied: a generated `▁yes` is the bytes ` yes`. Added tokens without the special
flag are their content's UTF-8 bytes. Any other tokenizer type raises `CheckpointError`.

Chat rendering uses the checkpoint's Jinja chat template (`template.ChatTemplate`: transformers'
environment, the special-token spellings as variables, OpenAI-shaped messages and tools); without
a template it falls back to ChatML (`chatml.py`).

Model families with their own Frontend are chosen by config.json's `model_type` (the one place is
`_family_frontend`): a Qwen3.5 checkpoint gets the Qwen3.5 Frontend (XML tool format, `<think>`
framing; qwen35.py), with the checkpoint's own tokenizer and template where it has them (its
framing tokens become control tokens), and the built-in vocabulary and template where it has no
tokenizer files. Every other checkpoint gets the Hermes tool format and no thinking framing.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from shared.frontends.chatml import RenderedPrompt
from shared.frontends.frontend import Frontend, HFTokenizer
from shared.frontends.template import ChatTemplate, TemplateError
from shared.frontends.token_domain import (
    TokenDomain,
    byte_level_to_bytes,
    gpt2_byte_decoder,
)
from shared.generation import PromptInput

METASPACE = "\u2581"  # "▁", SentencePiece's spelling of a space


class CheckpointError(ValueError):
    """A checkpoint's tokenizer files are missing, malformed or of an unsupported type: the
    operator's fault, never a request's. `file` names the file (and key) at fault."""

    def __init__(self, file: str, message: str) -> None:
        super().__init__(f"{file}: {message}")
        self.file = file


def _read_json(path: str, name: str, *, required: bool) -> dict[str, Any]:
    file = os.path.join(path, name)
    if not os.path.exists(file):
        if required:
            raise CheckpointError(name, f"not found in {path}")
        return {}
    with open(file, encoding="utf-8") as f:
        try:
            value = json.load(f)
        except json.JSONDecodeError as e:
            raise CheckpointError(name, f"is not valid JSON: {e}") from e
    if not isinstance(value, dict):
        raise CheckpointError(name, "must hold a JSON object")
    return value


def _component_types(node: Any, key: str) -> list[dict[str, Any]]:
    """The components of a tokenizer.json decoder / pre-tokenizer, `Sequence`s flattened."""
    if not isinstance(node, dict):
        return []
    if node.get("type") == "Sequence":
        return [c for child in node.get(key, []) for c in _component_types(child, key)]
    return [node]


def _vocabulary_kind(spec: dict[str, Any]) -> str:
    """"byte_level" or "sentencepiece"; raises CheckpointError naming any other tokenizer type."""
    decoders = _component_types(spec.get("decoder"), "decoders")
    pretoks = _component_types(spec.get("pre_tokenizer"), "pretokenizers")
    dec_types = [d.get("type") for d in decoders]
    if "ByteLevel" in dec_types or any(p.get("type") == "ByteLevel" for p in pretoks):
        return "byte_level"
    replaces_metaspace = any(d.get("type") == "Replace" and d.get("pattern", {}).get("String")
                             == METASPACE for d in decoders)
    if "ByteFallback" in dec_types or "Metaspace" in dec_types or replaces_metaspace:
        return "sentencepiece"
    model_type = (spec.get("model") or {}).get("type")
    raise CheckpointError(
        "tokenizer.json",
        f"tokenizer type {model_type!r} with decoder "
        f"{dec_types or None} is not supported: expected a byte-level BPE "
        "(ByteLevel) or a SentencePiece-style (ByteFallback / Metaspace) vocabulary",
    )


def _model_vocab(spec: dict[str, Any]) -> dict[int, str]:
    """id -> spelling of the tokenizer model's own vocabulary (BPE/WordPiece dict, Unigram list)."""
    vocab = (spec.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):
        return {int(i): t for t, i in vocab.items()}
    if isinstance(vocab, list):  # Unigram: [[piece, score], ...], id = position
        return {i: entry[0] for i, entry in enumerate(vocab)}
    raise CheckpointError("tokenizer.json", "model.vocab is missing")


def _spelling_to_bytes(kind: str, spelling: str, byte_fallback: bool, decoder: dict[str, int],
                       token_id: int) -> bytes:
    if kind == "byte_level":
        try:
            return byte_level_to_bytes(spelling, decoder)
        except KeyError as e:
            raise CheckpointError(
                "tokenizer.json",
                f"token {token_id} {spelling!r} has a character outside the byte-level alphabet",
            ) from e
    if (
        byte_fallback
        and len(spelling) == 6
        and spelling.startswith("<0x")
        and spelling.endswith(">")
    ):
        try:
            return bytes([int(spelling[3:5], 16)])
        except ValueError:
            pass
    return spelling.replace(METASPACE, " ").encode("utf-8")


def _ids(value: Any, file: str) -> set[int]:
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise CheckpointError(file, f"eos_token_id must be an int or a list of ints, got {value!r}")
    return set(values)


def _token_spelling(value: Any) -> str | None:
    """A tokenizer_config.json special-token entry: a string or an AddedToken dictionary."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def build_hf_domain(path: str, *, control_spellings: tuple[str, ...] = ()) -> TokenDomain:
    """The token domain of checkpoint directory `path` (see the module docstring for the rules).

    `control_spellings`: added tokens that are control tokens whatever their `special` flag (a
    model family's framing tokens, named by its Frontend). Raises CheckpointError for missing or
    unsupported tokenizer files, an EOS id outside the vocabulary or a `vocab_size` smaller than
    the tokenizer."""
    config = _read_json(path, "config.json", required=True)
    spec = _read_json(path, "tokenizer.json", required=True)
    generation = _read_json(path, "generation_config.json", required=False)
    tok_config = _read_json(path, "tokenizer_config.json", required=False)
    kind = _vocabulary_kind(spec)
    byte_fallback = bool((spec.get("model") or {}).get("byte_fallback")) or any(
        d.get("type") == "ByteFallback" for d in _component_types(spec.get("decoder"), "decoders"))
    decoder = gpt2_byte_decoder()

    spellings = _model_vocab(spec)
    added = spec.get("added_tokens") or []
    for entry in added:
        spellings[int(entry["id"])] = entry["content"]
    n = max(spellings) + 1 if spellings else 0
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    size = config.get("vocab_size", text_config.get("vocab_size", n))  # multimodal: text_config
    if not isinstance(size, int) or size < n:
        raise CheckpointError(
            "config.json vocab_size", f"must be an int >= the tokenizer's {n} ids, got {size!r}"
        )

    verbatim = {int(e["id"]) for e in added}  # added tokens decode as their content
    token_bytes = [b""] * n
    for i, s in spellings.items():
        token_bytes[i] = (s.encode("utf-8") if i in verbatim
                          else _spelling_to_bytes(kind, s, byte_fallback, decoder, i))
    specials = {e["content"]: int(e["id"]) for e in added
                if e.get("special") or e["content"] in control_spellings}

    by_spelling = {s: i for i, s in spellings.items()}
    eos = (_ids(generation.get("eos_token_id"), "generation_config.json")
           | _ids(config.get("eos_token_id"), "config.json")
           | _ids(text_config.get("eos_token_id"), "config.json text_config"))
    eos_spelling = _token_spelling(tok_config.get("eos_token"))
    if eos_spelling is not None:
        if eos_spelling not in by_spelling:
            raise CheckpointError(
                "tokenizer_config.json eos_token", f"{eos_spelling!r} is not a token"
            )
        eos.add(by_spelling[eos_spelling])
    if not eos:
        raise CheckpointError(
            "config.json eos_token_id",
            "no EOS token is declared (generation_config"
            ".json, config.json or tokenizer_config.json)",
        )
    bad = sorted(i for i in eos if not 0 <= i < n)
    if bad:
        raise CheckpointError("eos_token_id", f"ids {bad} are outside the tokenizer's {n} ids")
    for i in eos:
        specials.setdefault(spellings.get(i, ""), i)
    gaps = frozenset(range(n)) - frozenset(spellings)
    return TokenDomain(
        name=f"hf:{os.path.basename(os.path.realpath(path))}",
        token_bytes=tuple(token_bytes),
        size=size,
        eos_ids=frozenset(eos),
        control_ids=frozenset(specials.values()) - frozenset(eos),
        never_ids=gaps,
        special_names=tuple(sorted(specials.items(), key=lambda kv: kv[1])),
    )


# ---------------------------------------------------------------- frontends


def _read_template(path: str, tok_config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(default template, tool-use template) of the checkpoint; chat_template.jinja wins over
    tokenizer_config.json's `chat_template` (a string or a list of named templates)."""
    file = os.path.join(path, "chat_template.jinja")
    if os.path.exists(file):
        with open(file, encoding="utf-8") as f:
            return f.read(), None
    value = tok_config.get("chat_template")
    if value is None or isinstance(value, str):
        return value, None
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default"), named.get("tool_use")
    raise CheckpointError("tokenizer_config.json chat_template", "must be a string or a list of "
                          "{name, template} objects")


@dataclass(frozen=True, eq=False)
class HFFrontend:
    """One checkpoint directory's Frontend (`frontend`) and its token domain."""

    path: str
    frontend: Frontend

    @property
    def domain(self) -> TokenDomain:
        return self.frontend.domain

    def render(self, prompt: PromptInput) -> str:
        """The prompt text (special tokens spelled); see `render_prompt`."""
        return self.render_prompt(prompt).text

    def render_prompt(self, prompt: PromptInput) -> RenderedPrompt:
        """Render `prompt` with the checkpoint's chat template (`add_generation_prompt=True`; a
        continued final assistant message ends the text with its content instead). Raw text is
        returned as is. Raises InvalidRequest for bad messages, a template's raise_exception or a
        continued content the template changes."""
        return self.frontend.render(prompt)


_SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                 "mask_token")


def load_hf_frontend(path: str) -> HFFrontend:
    """The Frontend of checkpoint directory `path`, cached per real path. Raises CheckpointError
    for missing, malformed or unsupported tokenizer files or chat template."""
    return _load(os.path.realpath(path))


def _family_frontend(path: str, config: dict[str, Any], domain: TokenDomain | None, tokenizer,
                     template: ChatTemplate | None) -> Frontend:
    """The Frontend of the checkpoint's model family (see the module docstring); `domain`,
    `tokenizer` and `template` are the checkpoint's own (None: it has none)."""
    from shared.frontends import qwen35

    if qwen35.is_qwen35_config(config):
        try:
            if domain is None:
                return qwen35.checkpoint_frontend(path, config)
            return qwen35.qwen35_frontend(path, domain, tokenizer, template)
        except ValueError as e:
            raise CheckpointError("config.json", f"a Qwen3.5 checkpoint: {e}") from e
    if domain is None:
        raise CheckpointError("tokenizer.json", f"not found in {path}")
    return Frontend(path, domain, tokenizer, render=template) if template is not None \
        else Frontend(path, domain, tokenizer)


@lru_cache(maxsize=8)
def _load(path: str) -> HFFrontend:
    from tokenizers import Tokenizer

    from shared.frontends import qwen35

    config = _read_json(path, "config.json", required=True)
    family = qwen35.FRAMING_TOKENS if qwen35.is_qwen35_config(config) else ()
    if family and not os.path.exists(os.path.join(path, "tokenizer.json")):
        return HFFrontend(path, _family_frontend(path, config, None, None, None))
    domain = build_hf_domain(path, control_spellings=family)
    tok_config = _read_json(path, "tokenizer_config.json", required=False)
    source, tool_source = _read_template(path, tok_config)
    specials = tuple((k, s) for k in _SPECIAL_KEYS
                     if (s := _token_spelling(tok_config.get(k))) is not None)
    template = None
    if source is not None or tool_source is not None:
        try:
            template = ChatTemplate(source or tool_source, tool_source, specials)
        except TemplateError as e:
            raise CheckpointError("chat_template", str(e)) from e
    elif family:
        template = ChatTemplate(qwen35.qwen35_template(), None, specials)
    try:
        tokenizer = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    except Exception as e:  # tokenizers raises a plain Exception for files it cannot read
        raise CheckpointError("tokenizer.json", f"cannot be loaded: {e}") from e
    return HFFrontend(
        path, _family_frontend(path, config, domain, HFTokenizer(tokenizer), template)
    )
