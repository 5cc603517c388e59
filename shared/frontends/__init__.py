"""Model frontends: each model family's token domain (raw bytes, special classes) and tokenizer.

`get_domain(model)` is the one lookup by model name used by the grammar service and the worker: a
built-in name, or the path of a Hugging Face checkpoint directory (the worker's model name for it).
"""

from __future__ import annotations

import os

from shared.errors import InvalidRequest
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
