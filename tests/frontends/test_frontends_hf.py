"""The Frontend of a Hugging Face checkpoint directory, checked against transformers (tokenizer
decode, `apply_chat_template`) on a small random Qwen3 checkpoint whose tokenizer is built here
(the test machine downloads nothing): SmolLM2's byte-level BPE plus two added tokens, a Qwen-style
ChatML template with Hermes tools written for this test, padding rows in the embedding.

DESIGN.md: "The Frontend owns each model family's raw vocabulary bytes, the special-token classes
(EOS set, thinking and tool control tokens, tokens that can never be generated), the chat
rendering ... nothing infers token semantics from spellings."
"""

from __future__ import annotations

import json
import random

import pytest
import torch
import xgrammar as xgr
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers

from services.grammar.compiler import ModelCompiler
from services.grammar.engines.matching import legal_ids
from services.worker.client import open_in_process
from services.worker.engine import EngineConfig
from services.worker.runtime import load_runtime
from shared.contract import OutputConstraint, ToolDefinition
from shared.errors import InvalidRequest
from shared.frontends import get_domain
from shared.frontends.chatml import render_chatml
from shared.frontends.hf import CheckpointError, build_hf_domain, load_hf_frontend
from shared.frontends.smollm2 import smollm2_tokenizer
from shared.generation import (
    ChatMessage,
    FinishReason,
    GenerateRequest,
    PromptInput,
    ToolCall,
)
from tests.support.worker_support import collect, greedy

BASE_VOCAB = 49_152
PADDING_ROWS = 30

# A Qwen-style ChatML template with Hermes tool framing, written for this test.
TEMPLATE = """
{%- if messages[0].role == 'system' %}{% set system = messages[0].content %}\
{% set rest = messages[1:] %}
{%- else %}{% set system = none %}{% set rest = messages %}{% endif %}
{%- if tools %}
{{- '<|im_start|>system\\n' }}{% if system %}{{ system + '\\n\\n' }}{% endif %}
{{- '# Tools\\n\\nFunction signatures are listed inside <tools></tools>:\\n<tools>' }}
{%- for tool in tools %}{{ '\\n' + (tool | tojson) }}{% endfor %}
{{- '\\n</tools>\\n\\nCall a function with a JSON object inside <tool_call></tool_call>:\\n'
    '<tool_call>\\n{"name": <name>, "arguments": <object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif system is not none %}{{ '<|im_start|>system\\n' + system + '<|im_end|>\\n' }}
{%- endif %}
{%- for m in rest %}
  {%- if m.role == 'system' %}{{ raise_exception('a system message must come first') }}
  {%- elif m.role == 'tool' %}
    {%- if loop.first or rest[loop.index0 - 1].role != 'tool' %}{{ '<|im_start|>user' }}{% endif %}
    {{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}
    {%- if loop.last or rest[loop.index0 + 1].role != 'tool' %}{{ '<|im_end|>\\n' }}{% endif %}
  {%- else %}
    {{- '<|im_start|>' + m.role + '\\n' + m.content }}
    {%- for call in m.tool_calls or [] %}
      {{- ('\\n' if (m.content or not loop.first) else '') + '<tool_call>\\n{"name": "'
          + call.function.name + '", "arguments": ' + (call.function.arguments | tojson)
          + '}\\n</tool_call>' }}
    {%- endfor %}
    {{- '<|im_end|>\\n' }}
  {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}
"""

TOOL = ToolDefinition.create(
    "lookup",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    description="Weather <now> & 'later'",
)
TOOL_DICT = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Weather <now> & 'later'",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def write_tokenizer(path, *, extra_special: str, extra_plain: str) -> Tokenizer:
    """SmolLM2's tokenizer (a copy: the cached one is never changed) plus one non-special and one
    special added token, saved as tokenizer.json."""
    tok = Tokenizer.from_str(smollm2_tokenizer().to_str())
    tok.add_tokens([AddedToken(extra_plain, special=False, normalized=False)])
    tok.add_special_tokens([AddedToken(extra_special, special=True, normalized=False)])
    tok.save(str(path / "tokenizer.json"))
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    path = tmp_path_factory.mktemp("qwen3-tiny")
    tok = write_tokenizer(path, extra_special="<|reserved|>", extra_plain="<think>")
    config = Qwen3Config(
        vocab_size=BASE_VOCAB + 2 + PADDING_ROWS,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=1024,
        eos_token_id=tok.token_to_id("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen3ForCausalLM(config).save_pretrained(path)
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "chat_template": TEMPLATE,
                "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>",
                "clean_up_tokenization_spaces": False,
            }
        )
    )
    return path


@pytest.fixture(scope="module")
def hf_tokenizer(checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(checkpoint))


def test_domain_bytes_equal_transformers_decode(checkpoint, hf_tokenizer):
    """Ordinary tokens match grammars by their raw bytes: each id's bytes, shown with replacement
    as a lossy display decode would, equal transformers' decode of that id alone; runs of random
    ids concatenate to transformers' decode of the run (multi-byte characters split across ids)."""
    domain = load_hf_frontend(str(checkpoint)).domain
    ordinary = [i for i in range(len(domain.token_bytes)) if domain.is_ordinary(i)]
    assert len(ordinary) == BASE_VOCAB + 1 - 17  # SmolLM2's 17 control tokens, plus "<think>"
    texts = hf_tokenizer.batch_decode([[i] for i in ordinary], clean_up_tokenization_spaces=False)
    for i, text in zip(ordinary, texts):
        assert domain.token_bytes[i].decode("utf-8", errors="replace") == text, i
    rng = random.Random(0)
    for _ in range(200):
        run = [rng.choice(ordinary) for _ in range(rng.randint(2, 6))]
        joined = b"".join(domain.token_bytes[i] for i in run).decode("utf-8", errors="replace")
        assert joined == hf_tokenizer.decode(run, clean_up_tokenization_spaces=False)
    assert domain.token_bytes[hf_tokenizer.convert_tokens_to_ids("<think>")] == b"<think>"


def test_special_classes_come_from_the_files(checkpoint):
    """EOS ids: config.json eos_token_id and tokenizer_config.json eos_token; every other
    `special: true` added token is a control token; embedding rows past the tokenizer are never
    legal. Checked in a compiled grammar's first mask: for a language accepting any text, every
    ordinary id holding whole UTF-8 text and EOS is legal, no control or padding id is."""
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    domain = load_hf_frontend(str(checkpoint)).domain
    eos = {tok.token_to_id("<|endoftext|>"), tok.token_to_id("<|im_end|>")}
    special = {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    assert domain.eos_ids == eos
    assert (
        domain.control_ids == special - eos
        and tok.token_to_id("<|reserved|>") in domain.control_ids
    )
    assert (
        domain.size == BASE_VOCAB + 2 + PADDING_ROWS and len(domain.token_bytes) == BASE_VOCAB + 2
    )

    compiled = ModelCompiler(domain).compile(OutputConstraint.regex("[\\s\\S]*")).grammar
    matcher = xgr.GrammarMatcher(compiled)
    mask = xgr.allocate_token_bitmask(1, domain.size)
    matcher.fill_next_token_bitmask(mask)
    legal = set(legal_ids(mask[0], domain.size))
    ordinary = {i for i in range(domain.size) if domain.is_ordinary(i)}
    assert legal <= ordinary | eos and eos <= legal  # never a control or padding id
    assert {i for i in ordinary if valid_utf8(domain.token_bytes[i])} <= legal  # every whole text


def test_rendering_equals_transformers_apply_chat_template(checkpoint, hf_tokenizer):
    """The chat rendering is the checkpoint's own template: equal to transformers'
    `apply_chat_template` for plain messages, with tools and tool history, and for a continued
    final assistant message."""
    frontend = load_hf_frontend(str(checkpoint))
    plain = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <there>"}]
    ours = frontend.render(PromptInput(messages=(ChatMessage("system", "Be brief."),
                                                 ChatMessage("user", "Hi <there>"))))
    assert ours == hf_tokenizer.apply_chat_template(
        plain, tokenize=False, add_generation_prompt=True
    )

    history = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": "c1", "type": "function",
                         "function": {"name": "lookup", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "sunny", "tool_call_id": "c1"},
    ]
    prompt = PromptInput(messages=(
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", None, (ToolCall("c1", "lookup", '{"city":"Paris"}'),)),
        ChatMessage("tool", "sunny", tool_call_id="c1"),
    ), tools=(TOOL,))
    expected = hf_tokenizer.apply_chat_template(history, tools=[TOOL_DICT], tokenize=False,
                                                add_generation_prompt=True)
    assert frontend.render(prompt) == expected and "<tool_response>" in expected

    cont = [{"role": "user", "content": "Count"}, {"role": "assistant", "content": "1, 2,"}]
    rendered = frontend.render_prompt(
        PromptInput(
            messages=(ChatMessage("user", "Count"), ChatMessage("assistant", "1, 2,")),
            continue_final_assistant=True,
        )
    )
    assert rendered.text == hf_tokenizer.apply_chat_template(cont, tokenize=False,
                                                             continue_final_message=True)
    assert rendered.continuation == "1, 2,"


def test_template_raise_exception_is_a_request_error(checkpoint):
    """A template's raise_exception is the client's fault (its messages): InvalidRequest on
    `messages`, carrying the template's message."""
    frontend = load_hf_frontend(str(checkpoint))
    prompt = PromptInput(messages=(ChatMessage("user", "a"), ChatMessage("system", "late")))
    with pytest.raises(InvalidRequest, match="a system message must come first") as info:
        frontend.render(prompt)
    assert info.value.field == "messages"


def test_sentencepiece_vocabulary_bytes(tmp_path):
    """SentencePiece-style vocabularies: `▁` is a space and `<0xNN>` the raw byte NN; the bytes of
    an encoded text's ids concatenate to the text (with the normalizer's leading space)."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += ["\u2581", "h", "i", "\u2581h", "\u2581hi", "x"]
    vocab = {p: i for i, p in enumerate(pieces)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[("\u2581", "h"), ("\u2581h", "i")],
                               byte_fallback=True, unk_token="<unk>"))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse()])
    tok.add_special_tokens([AddedToken(p, special=True, normalized=False) for p in pieces[:3]])
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 300, "eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 1]}))
    domain = build_hf_domain(str(tmp_path))
    text = "hi hé xi"
    ids = tok.encode(text, add_special_tokens=False).ids
    assert any(pieces[i].startswith("<0x") for i in ids)  # "é" went through byte fallback
    assert b"".join(domain.token_bytes[i] for i in ids) == (" " + text).encode("utf-8")
    assert tok.decode(ids) == " " + text  # the independent decoder agrees
    assert domain.eos_ids == {1, 2} and domain.control_ids == {0}  # a list of EOS ids
    assert domain.never_ids == set() and domain.size == 300 > len(pieces)


def test_without_a_template_chat_falls_back_to_chatml(checkpoint, tmp_path):
    """A checkpoint without a chat template renders chat messages as ChatML."""
    for name in ("config.json", "tokenizer.json"):
        (tmp_path / name).write_bytes((checkpoint / name).read_bytes())
    prompt = PromptInput(messages=(ChatMessage("user", "Hi"),), tools=(TOOL,))
    assert load_hf_frontend(str(tmp_path)).render(prompt) == render_chatml(prompt).text


def test_unsupported_tokenizer_type_is_named(tmp_path):
    """A vocabulary whose raw bytes we cannot know exactly is refused, naming its type."""
    tok = Tokenizer(models.WordPiece(vocab={"[UNK]": 0, "a": 1, "##b": 2}, unk_token="[UNK]"))
    tok.decoder = decoders.WordPiece()
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 3, "eos_token_id": 0}))
    with pytest.raises(CheckpointError, match="'WordPiece'"):
        build_hf_domain(str(tmp_path))


@pytest.mark.asyncio
async def test_engine_serves_the_checkpoint_directory(checkpoint):
    """A checkpoint directory is a model name: load_runtime loads it, get_domain(path) gives the
    grammar service the same domain, and a choice constraint makes even a random model produce
    exactly one of the choices."""
    runtime = load_runtime(str(checkpoint))
    assert get_domain(str(checkpoint)) is runtime.domain
    prepared = runtime.prepare(PromptInput(messages=(ChatMessage("user", "Yes or no?"),)))
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    assert tok.decode(list(prepared.token_ids), skip_special_tokens=False).endswith(
        "<|im_start|>user\nYes or no?<|im_end|>\n<|im_start|>assistant\n")
    client = open_in_process(runtime, EngineConfig(max_batch=2, max_len=512))
    try:
        request = GenerateRequest("r", PromptInput(messages=(ChatMessage("user", "Yes or no?"),)),
                                  greedy(6, constraint=OutputConstraint.choice(["yes", "no"])),
                                  model=str(checkpoint))
        deltas, finished = await collect(client, request)
    finally:
        await client.aclose()
    assert "".join(deltas) in ("yes", "no") and finished.content == "".join(deltas)
    assert finished.finish_reason == FinishReason.STOP, finished.error
