"""Log-probabilities of one logits row under the sampling rule of `kernels.sampling_contract`,
in plain torch on any device (a handful of reductions over the row; no Triton kernel needed).

`processed_logprobs` gives the log of the distribution a token is sampled from: z are the
penalized logits with every illegal (masked) and never-generable id at -inf; at T > 0 the weights
exp(z/T - max), truncated by top-k, min-p and top-p exactly as the sampler truncates them, and
renormalised: log p(v) = z_v/T - max - log(sum of the kept weights), -inf outside the kept
support. A greedy row (T = 0) samples a one-hot, which says nothing; its log-probabilities are
the masked log-softmax of z at temperature 1, with no truncation, so the chosen token (the
largest legal z, ties to the smaller id) is the most likely one.

The kept support needs the candidate order only up to the truncation point, never a sort of the
whole row: top-k takes `topk(k)`; top-p without top-k takes `topk(c)` with c growing until the
cut lies inside it. Candidate order is value descending with ties to the smaller id, as the
sampler's stable sort (`kernels/sampling_ref.py`), and the kept set is every id before the last
kept candidate in that order.
"""

from __future__ import annotations

import torch

_FIRST_WIDTH = 64  # candidates read at first for a top-p cut without top-k


def stable_top(values: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The first n of each row in candidate order (value descending, ties to the smaller id,
    also where a finite tie straddles the n-th place), without sorting the row: values [R, V]
    (or [V]) -> (values [R, n], ids [R, n] int64) (or [n] each). Entries at -inf (never listed)
    come in no particular order."""
    if values.dim() == 1:
        vals, ids = stable_top(values[None], n)
        return vals[0], ids[0]
    n = min(n, values.shape[1])
    vals, ids = torch.topk(values, n, dim=1)  # [R, n]
    last = vals[:, -1:]  # [R, 1] the n-th largest value
    tie = values == last
    straddles = torch.isfinite(last[:, 0]) & (tie.sum(1) > (vals == last).sum(1))
    if bool(straddles.any()):  # topk may have kept a larger tied id: take the smallest ones
        above = values > last  # fewer than n per row
        need = n - above.sum(1, keepdim=True)  # [R, 1]
        take = above | (tie & (torch.cumsum(tie, 1) <= need))  # exactly n per row
        ids = take.nonzero()[:, 1].view(-1, n)  # [R, n] ascending ids
    else:
        ids = torch.sort(ids, dim=1).values
    vals, order = torch.sort(values.gather(1, ids), dim=1, descending=True, stable=True)
    return vals, ids.gather(1, order)


def processed_logprobs(z: torch.Tensor, *, temperature: float, top_k: int = 0,
                       top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor | None:
    """z: [V] float32 penalized logits, illegal ids at -inf. Returns log p [V] float32 (-inf
    outside the support; see the module docstring), or None when no legal value is finite."""
    z = z.float()
    top = z.max()
    if not torch.isfinite(top):
        return None
    if temperature == 0:
        return torch.log_softmax(z, 0)
    zs = z / temperature
    m = zs.max()
    w = torch.exp(zs - m)  # [V], 1 at the top
    base = (w > 0) & (w >= min_p)
    size = int(base.sum())
    k = top_k if 0 < top_k < size else 0
    if k or top_p < 1:
        last = _last_kept(zs, m, base, size, k, top_p, min_p)
        if last is not None:
            value, index = last
            ids = torch.arange(zs.shape[0], device=zs.device)
            base = base & ((zs > value) | ((zs == value) & (ids <= index)))
    total = torch.where(base, w, 0.0).sum()
    return torch.where(base, zs - m - torch.log(total), float("-inf"))


def _last_kept(zs, m, base, size: int, k: int, top_p: float, min_p: float):
    # The last kept candidate (value, id) in candidate order, or None when nothing past the
    # base support is cut.
    total = None if k else torch.where(base, torch.exp(zs - m), 0.0).sum()
    width = k if k else min(_FIRST_WIDTH, size)
    while True:
        vals, ids = stable_top(zs, width)
        w = torch.exp(vals - m)
        keep = (w > 0) & (w >= min_p)
        w = torch.where(keep, w, 0.0)
        mass = w.sum() if k else total
        if top_p < 1:
            before = torch.cumsum(w, 0) - w
            keep = keep & (before < top_p * mass)
        inside = bool(k) or width >= size or bool((~keep).any())
        if inside:
            last = int(keep.nonzero()[-1])
            return vals[last], ids[last]
        width = min(4 * width, size)


def untruncated_logprobs(z: torch.Tensor, temperature: torch.Tensor,
                         min_p: torch.Tensor) -> torch.Tensor:
    """Rows without top-k or top-p truncation, batched: z [R, V] float32 penalized logits
    (illegal ids -inf), temperature [R] (> 0; a greedy row passes 1), min_p [R] (a greedy row
    passes 0) -> log p [R, V], as `processed_logprobs` gives each row; a row with no finite
    value is all -inf."""
    zs = z.float() / temperature[:, None]
    m = zs.max(1, keepdim=True).values  # [R, 1]
    w = torch.exp(zs - m)
    base = (w > 0) & (w >= min_p[:, None])
    total = torch.where(base, w, 0.0).sum(1, keepdim=True)
    return torch.where(base, zs - m - torch.log(total), float("-inf"))


def raw_logprobs(z: torch.Tensor) -> torch.Tensor:
    """z: [..., V] the model's logits (never-generable ids at -inf): log-softmax at temperature
    1, before penalties, the grammar mask and the sampling transforms."""
    return torch.log_softmax(z.float(), -1)
