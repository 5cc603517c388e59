"""The Qwen3.5 multi-token-prediction (MTP) module, loaded from a checkpoint's `mtp.*` tensors.

Given the target's final (normed) hidden state h_t and the embedding of the next token x_{t+1}
(as the checkpoint's reference implementation computes it):

    u      = fc([pre_fc_norm_embedding(embed(x_{t+1})); pre_fc_norm_hidden(h_t)])   embedding first
    u      = one full-attention decoder layer (gated attention + SwiGLU) over u, with its own KV
    hidden = norm(u)
    logits = lm_head(hidden)          the target's LM head: a prediction of x_{t+2}

The embedding and the LM head are the target model's (`Qwen35Model.mtp_forward`); the layer's KV
lives in the model state (`Qwen35State.mtp_layer`). Proposing drafts with it is the speculative
decoder's business.
"""

from __future__ import annotations

import torch
from torch import nn

from services.worker.models.qwen35_config import Qwen35Config
from services.worker.models.qwen35_layers import DecoderLayer, Qwen35RMSNorm


class MTPHead(nn.Module):
    def __init__(self, config: Qwen35Config, dtype: torch.dtype | None = None, device=None) -> None:
        super().__init__()
        kw = {"dtype": dtype, "device": device}
        H = config.hidden_size
        self.pre_fc_norm_embedding = Qwen35RMSNorm(H, config.rms_norm_eps, **kw)
        self.pre_fc_norm_hidden = Qwen35RMSNorm(H, config.rms_norm_eps, **kw)
        self.fc = nn.Linear(2 * H, H, bias=False, **kw)
        self.layers = nn.ModuleList([DecoderLayer(config, "full_attention", **kw)])
        self.norm = Qwen35RMSNorm(H, config.rms_norm_eps, **kw)

    def fuse(self, embedded: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[B, T, H] embeddings of x_{t+1} and target hidden states h_t -> the layer input
        [B, T, H]."""
        return self.fc(
            torch.cat(
                (self.pre_fc_norm_embedding(embedded), self.pre_fc_norm_hidden(hidden)), dim=-1
            )
        )
