"""Qwen3.5 checkpoint directories get the Qwen3.5 Frontend (shared/frontends/hf.py,
`_family_frontend`): their own tokenizer and template where they have them, the built-in
vocabulary and template where they have no tokenizer files.

Issue 9: "for any Qwen3.5 checkpoint directory (whose own tokenizer and chat template win over
built-in ones)". Design document: "Model framing may use the exact ids of its control tokens";
"an ordinary token spelling and a special token with the same visible string are handled
separately".
"""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken, Tokenizer

from shared.frontends import get_frontend
from shared.frontends.formats import QWEN_XML
from shared.frontends.hf import CheckpointError, load_hf_frontend
from shared.frontends.qwen35 import EMBEDDING_ROWS, FRAMING_TOKENS, qwen35_template
from shared.frontends.smollm2 import smollm2_tokenizer
from shared.frontends.thinking import REASONING
from shared.generation import ChatMessage, PromptInput

PROMPT = PromptInput(messages=(ChatMessage("user", "Hi"),))


def _config(path, vocab_size: int) -> None:
    (path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "architectures": ["Qwen3_5ForConditionalGeneration"],
        "text_config": {"model_type": "qwen3_5_text", "vocab_size": vocab_size,
                        "eos_token_id": 248046}}))


def test_directory_without_tokenizer_uses_the_built_in_frontend(tmp_path) -> None:
    """No tokenizer files: the built-in vocabulary, tokenizer and template, named by the path."""
    _config(tmp_path, EMBEDDING_ROWS)
    frontend = load_hf_frontend(str(tmp_path)).frontend
    builtin = get_frontend("qwen3.5")
    assert frontend.name == str(tmp_path.resolve()) and frontend.domain is builtin.domain
    assert frontend.tool_format is QWEN_XML and frontend.thinking == builtin.thinking
    assert frontend.prepare(PROMPT) == builtin.prepare(PROMPT)
    wrong = tmp_path / "wrong"
    wrong.mkdir()
    _config(wrong, 1000)
    with pytest.raises(CheckpointError):
        load_hf_frontend(str(wrong))


@pytest.mark.parametrize("own_template", [False, True])
def test_own_tokenizer_and_template_win(tmp_path, own_template) -> None:
    """A checkpoint's own tokenizer.json (framing tokens added with special=false) and template:
    the framing tokens are control tokens (their spelling with ordinary tokens stays text), the
    tool format is XML, the thinking framing uses the checkpoint's ids, and its own template
    renders the prompt (the built-in one without)."""
    tok = Tokenizer.from_str(smollm2_tokenizer().to_str())
    tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in FRAMING_TOKENS])
    tok.add_special_tokens([AddedToken("<|im_end|>", special=True, normalized=False)])
    tok.save(str(tmp_path / "tokenizer.json"))
    n = tok.get_vocab_size()
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "qwen3_5", "text_config": {"model_type": "qwen3_5_text",
                                                 "vocab_size": n + 7,
                                                 "eos_token_id": tok.token_to_id("<|im_end|>")}}))
    template = qwen35_template().replace("# Tools", "# Werkzeuge")
    if own_template:
        (tmp_path / "chat_template.jinja").write_text(template)
    frontend = load_hf_frontend(str(tmp_path)).frontend
    ids = {s: tok.token_to_id(s) for s in FRAMING_TOKENS}
    assert set(ids.values()) <= frontend.domain.control_ids
    assert frontend.tool_format is QWEN_XML
    assert (frontend.thinking.open_id, frontend.thinking.close_id) == (ids["<think>"],
                                                                        ids["</think>"])
    prepared = frontend.prepare(PROMPT)
    assert prepared.phase == REASONING and prepared.token_ids[-2] == ids["<think>"]
    from shared.contract import ToolDefinition

    with_tools = PromptInput(messages=PROMPT.messages, tools=(ToolDefinition.create("f"),))
    assert ("# Werkzeuge" in frontend.render(with_tools).text) == own_template
