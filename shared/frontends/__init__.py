"""Model frontends: each model family's token domain, tokenizer, chat rendering, tool-call format
and thinking framing (frontend.py), built from the model's own files.

`get_domain(model)` is the one lookup by model name used by the grammar service (the domain only);
`get_frontend(model)` gives the whole Frontend the worker serves. A model name is a built-in name
or the path of a Hugging Face checkpoint directory (the worker's model name for it).
"""

from __future__ import annotations

import os
from functools import lru_cache

from shared.errors import InvalidRequest
from shared.frontends.frontend import Frontend
from shared.frontends.token_domain import TokenDomain

MODELS = ("smollm2", "qwen3.5")


def get_domain(model: str) -> TokenDomain:
    """The token domain of a built-in model name or of a checkpoint directory path (built once per
    real path). Raises InvalidRequest for a name that is neither, CheckpointError for a directory
    whose tokenizer files are missing or unsupported."""
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_domain

        return smollm2_domain()
    if model == "qwen3.5":
        from shared.frontends.qwen35 import qwen35_domain

        return qwen35_domain()
    if os.path.isdir(model):
        if _builtin_vocabulary(model):
            return get_domain("qwen3.5")
        from shared.frontends.hf import load_hf_frontend

        return load_hf_frontend(model).domain
    raise InvalidRequest(f"unknown model {model!r}; expected one of {', '.join(MODELS)} or a "
                         "checkpoint directory", field="model")


def get_frontend(model: str) -> Frontend:
    """The Frontend of a built-in model name or a checkpoint directory (raises as `get_domain`)."""
    if os.path.isdir(model):
        if _builtin_vocabulary(model):
            return _builtin("qwen3.5")
        from shared.frontends.hf import load_hf_frontend

        return load_hf_frontend(model).frontend
    return _builtin(model)


def _builtin_vocabulary(path: str) -> bool:
    """A Qwen3.5 checkpoint directory without tokenizer files uses the built-in Qwen3.5
    frontend (its config.json names the family)."""
    if os.path.exists(os.path.join(path, "tokenizer.json")):
        return False
    import json

    from shared.frontends.qwen35 import is_qwen35_config

    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and is_qwen35_config(config)


@lru_cache(maxsize=None)
def _builtin(model: str) -> Frontend:
    from shared.frontends.frontend import HFTokenizer, TiktokenTokenizer

    domain = get_domain(model)  # raises for unknown names
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_tokenizer

        return Frontend(model, domain, HFTokenizer(smollm2_tokenizer()))
    from shared.frontends.qwen35 import qwen35_tokenizer, render_raw_text

    return Frontend(model, domain, TiktokenTokenizer(qwen35_tokenizer()), render=render_raw_text)


__all__ = ["Frontend", "MODELS", "get_domain", "get_frontend"]
