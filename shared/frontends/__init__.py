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
        from shared.frontends.hf import load_hf_frontend

        return load_hf_frontend(model).domain
    raise InvalidRequest(f"unknown model {model!r}; expected one of {', '.join(MODELS)} or a "
                         "checkpoint directory", field="model")


def get_frontend(model: str) -> Frontend:
    """The Frontend of a built-in model name or a checkpoint directory (raises as `get_domain`)."""
    if os.path.isdir(model):
        from shared.frontends.hf import load_hf_frontend

        return load_hf_frontend(model).frontend
    return _builtin(model)


@lru_cache(maxsize=None)
def _builtin(model: str) -> Frontend:
    from shared.frontends.frontend import HFTokenizer

    domain = get_domain(model)  # raises for unknown names
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_tokenizer

        return Frontend(model, domain, HFTokenizer(smollm2_tokenizer()))
    from shared.frontends.qwen35 import qwen35_frontend

    return qwen35_frontend(model, domain)


__all__ = ["Frontend", "MODELS", "get_domain", "get_frontend"]
