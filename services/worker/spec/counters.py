"""The Engine's speculation counters (all requests, constrained or not)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SpecCounters:
    """The Engine's global speculation counters (all requests, constrained or not)."""

    rounds: int = 0  # committed rows of verification rounds that carried drafts
    drafts: int = 0  # drafts proposed in those rows
    accepted: int = 0  # drafts committed
    tokens: int = 0  # output tokens those rows committed (accepted + correction / bonus)
    draft_seconds: float = 0.0  # host time spent proposing (exposed: the forward waits for it)

    def to_dict(self, model_draft_seconds: float = 0.0) -> dict:
        """Counters as JSON; `model_draft_seconds`: the Program's wait for a model proposer's
        drafts (MTP, DFlash), added to the exposed draft time."""
        mean = self.accepted / self.rounds if self.rounds else 0.0
        return {"rounds": self.rounds, "drafts": self.drafts, "accepted": self.accepted,
                "tokens": self.tokens, "mean_accepted": mean,
                "acceptance_rate": self.accepted / self.drafts if self.drafts else 0.0,
                "draft_seconds": self.draft_seconds + model_draft_seconds}
