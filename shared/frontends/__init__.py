"""Model frontends: each model family's token domain (raw bytes, special classes) and tokenizer.

`get_domain(model)` is the one lookup by model name used by the grammar service and the worker.
"""

from __future__ import annotations

from shared.errors import InvalidRequest
from shared.frontends.token_domain import TokenDomain

MODELS = ("smollm2", "qwen3.5")


def get_domain(model: str) -> TokenDomain:
    """The token domain of a built-in model name; raises InvalidRequest for an unknown name."""
    if model == "smollm2":
        from shared.frontends.smollm2 import smollm2_domain

        return smollm2_domain()
    if model == "qwen3.5":
        from shared.frontends.qwen35 import qwen35_domain

        return qwen35_domain()
    raise InvalidRequest(f"unknown model {model!r}; expected one of {', '.join(MODELS)}", field="model")
