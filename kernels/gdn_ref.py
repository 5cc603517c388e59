"""Plain-torch references of the gated delta rule (the Gated DeltaNet recurrence) and of the
depthwise causal conv in front of it. They run on any device; the CPU tests compare the Triton
kernels (kernels/gdn.py, kernels/conv.py) and the chunked form against `gated_delta_rule_ref`.

The recurrence, per value head, as the Gated DeltaNet paper states it (S is d_k x d_v, float32):

    for t in 0..T-1:
        S   = exp(g[t]) * S                      # decay, g <= 0
        d   = beta[t] * (v[t] - S^T k[t])        # the delta: what S mispredicts for k[t]
        S   = S + k[t] d^T
        o[t] = S^T q[t]

q and k arrive already L2-normalised (and q scaled by d_k^-1/2); each key head serves
Hv / Hk consecutive value heads. A token with g = 0 and beta = 0 leaves S bit for bit unchanged
(exp(0) = 1, and the update adds k * 0): that is how right-padded rows keep their state.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _expand_heads(x: torch.Tensor, hv: int) -> torch.Tensor:
    # x: [B, T, Hk, D] -> [B, T, Hv, D], key head j serving value heads j*r .. j*r + r - 1
    return x.repeat_interleave(hv // x.shape[2], dim=2) if x.shape[2] != hv else x


def gated_delta_rule_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The recurrence token by token, in float32 (float64 inputs stay float64).

    q, k: [B, T, Hk, dk]; v: [B, T, Hv, dv]; g, beta: [B, T, Hv]; state: [B, Hv, dk, dv].
    Returns (o: [B, T, Hv, dv] in v's dtype, final state: [B, Hv, dk, dv] in state's dtype).
    """
    ct = torch.float64 if state.dtype == torch.float64 else torch.float32
    hv = v.shape[2]
    q, k = _expand_heads(q, hv).to(ct), _expand_heads(k, hv).to(ct)
    vv, g, beta = v.to(ct), g.to(ct), beta.to(ct)
    s = state.to(ct).clone()  # [B, Hv, dk, dv]
    out = torch.empty(vv.shape, dtype=ct, device=v.device)  # [B, T, Hv, dv]
    for t in range(v.shape[1]):
        s = s * g[:, t].exp()[:, :, None, None]
        kt = k[:, t]  # [B, Hv, dk]
        d = beta[:, t, :, None] * (vv[:, t] - torch.einsum("bhkv,bhk->bhv", s, kt))  # [B, Hv, dv]
        s = s + kt[:, :, :, None] * d[:, :, None, :]
        out[:, t] = torch.einsum("bhkv,bhk->bhv", s, q[:, t])
    return out.to(v.dtype), s.to(state.dtype)


def chunk_gated_delta_rule_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor, chunk: int = 64
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The same recurrence in chunks of `chunk` tokens (matmuls instead of T sequential steps;
    the GPU fallback for long prefill without fla-core). Same arguments and results as
    `gated_delta_rule_ref`.

    Inside a chunk with entry state S and cumulative log decay G[t] = g[0] + ... + g[t], the deltas
    u solve the unit lower-triangular system
        u[t] + sum_{i<t} beta[t] e^(G[t]-G[i]) (k[t].k[i]) u[i] = beta[t] (v[t] - e^G[t] S^T k[t])
    and then  o[t] = e^G[t] S^T q[t] + sum_{i<=t} e^(G[t]-G[i]) (q[t].k[i]) u[i],
              S'   = e^G[C-1] S + sum_i e^(G[C-1]-G[i]) k[i] u[i]^T.
    """
    ct = torch.float64 if state.dtype == torch.float64 else torch.float32
    B, T, hv, dv = v.shape
    pad = (-T) % chunk
    # to [B, Hv, T, D] in the compute dtype, zero-padded to a whole number of chunks (g = beta = 0:
    # the padding leaves the state unchanged)
    q, k = (F.pad(_expand_heads(x, hv).to(ct).transpose(1, 2), (0, 0, 0, pad)) for x in (q, k))
    vv = F.pad(v.to(ct).transpose(1, 2), (0, 0, 0, pad))
    g, beta = (F.pad(x.to(ct).transpose(1, 2), (0, pad)) for x in (g, beta))
    n = (T + pad) // chunk
    q, k, vv = (x.reshape(B, hv, n, chunk, x.shape[-1]) for x in (q, k, vv))  # [B, Hv, N, C, D]
    g, beta = g.reshape(B, hv, n, chunk), beta.reshape(B, hv, n, chunk)  # [B, Hv, N, C]
    G = g.cumsum(-1)  # [B, Hv, N, C]
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()  # i <= t
    decay = (
        (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    )  # [.., C, C]
    kk = k @ k.transpose(-1, -2)  # [B, Hv, N, C, C]
    system = torch.eye(chunk, dtype=ct, device=v.device) + \
        (beta[..., :, None] * decay * kk).masked_fill(causal.logical_not() | torch.eye(
            chunk, dtype=torch.bool, device=v.device), 0.0)  # unit lower triangular
    qk = (q @ k.transpose(-1, -2)) * decay  # [B, Hv, N, C, C]
    s = state.to(ct).clone()  # [B, Hv, dk, dv]
    out = torch.empty_like(vv)  # [B, Hv, N, C, dv]
    for c in range(n):
        eg = G[:, :, c].exp()[..., None]  # [B, Hv, C, 1]
        rhs = beta[:, :, c, :, None] * (vv[:, :, c] - eg * (k[:, :, c] @ s))  # [B, Hv, C, dv]
        u = torch.linalg.solve_triangular(system[:, :, c], rhs, upper=False, unitriangular=True)
        out[:, :, c] = eg * (q[:, :, c] @ s) + qk[:, :, c] @ u
        tail = (G[:, :, c, -1:] - G[:, :, c]).exp()[..., None]  # [B, Hv, C, 1]
        s = G[:, :, c, -1].exp()[..., None, None] * s + (k[:, :, c] * tail).transpose(-1, -2) @ u
    out = out.reshape(B, hv, n * chunk, dv)[:, :, :T].transpose(1, 2)
    return out.to(v.dtype), s.to(state.dtype)


def causal_conv1d_ref(x: torch.Tensor, window: torch.Tensor, weight: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal conv + SiLU over a chunk that continues `window`.

    x: [B, T, C] this chunk's inputs; window: [B, C, K-1] the K-1 inputs before it (zeros at the
    start of a sequence); weight: [C, K] (tap K-1 multiplies the current input).
    Returns (silu(conv): [B, T, C] in x's dtype, the full stream [B, C, K-1+T] whose columns
    n .. n+K-2 are the window after the first n tokens).
    """
    K = weight.shape[1]
    stream = torch.cat((window.to(x.dtype), x.transpose(1, 2)), dim=2)  # [B, C, K-1+T]
    y = F.conv1d(stream.to(weight.dtype), weight[:, None, :], groups=weight.shape[0])  # [B, C, T]
    assert y.shape[2] == x.shape[1] and K >= 2
    return F.silu(y.float()).to(x.dtype).transpose(1, 2), stream


def window_after(stream: torch.Tensor, counts: torch.Tensor, width: int) -> torch.Tensor:
    """Columns counts[b] .. counts[b] + width - 1 of stream [B, C, L] per row: [B, C, width]."""
    idx = counts[:, None] + torch.arange(width, device=stream.device)  # [B, width]
    return stream.gather(2, idx[:, None, :].expand(-1, stream.shape[1], -1))


def gdn_recurrent_ref(q: torch.Tensor | None, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, state: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                      reset: torch.Tensor, skip: torch.Tensor | None = None) -> torch.Tensor | None:
    """kernels/gdn.py's `gdn_recurrent` in torch: the recurrence from state[src[b]] (zeros where
    reset[b]) written to state[dst[b]], rows with skip[b] untouched; o [B, T, Hv, dv] or None."""
    s0 = torch.where(reset[:, None, None, None] != 0, 0.0, state[src])  # [B, Hv, dk, dv]
    o, s1 = gated_delta_rule_ref(k if q is None else q, k, v, g, beta, s0)
    if skip is not None:
        s1 = torch.where(skip[:, None, None, None] != 0, state[dst], s1)
    state[dst] = s1
    return None if q is None else o


def causal_conv1d_indexed_ref(
    x: torch.Tensor,
    windows: torch.Tensor,
    weight: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """kernels/conv.py's `causal_conv1d` in torch (any kernel width): y [B, T, C]; windows[dst[b]]
    becomes the window after the row's first counts[b] tokens."""
    before = torch.where(reset[:, None, None] != 0, 0, windows[src])  # [B, C, K-1]
    y, stream = causal_conv1d_ref(x, before, weight)
    windows[dst] = window_after(stream, counts, weight.shape[1] - 1).to(windows.dtype)
    return y


def l2norm(x: torch.Tensor) -> torch.Tensor:
    """x / sqrt(sum(x^2) + 1e-6) over the last dim, float32 (the eps of transformers and fla)."""
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def gdn_inputs(
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    counts: torch.Tensor,
    *,
    num_k_heads: int,
    key_dim: int,
) -> tuple[torch.Tensor, ...]:
    """A GDN layer's recurrence inputs from the conv output y [B, T, C] = [q | k | v] and the raw
    gate projections a, b [B, T, Hv]: (q [B, T, Hk, dk] normalised and scaled by dk^-1/2, k
    normalised, both float32; v [B, T, Hv, dv]; g = -exp(A_log) softplus(a + dt_bias) and
    beta = sigmoid(b), float32 [B, T, Hv], zero on tokens t >= counts[b])."""
    B, T, C = y.shape
    hk, dk, hv = num_k_heads, key_dim, a.shape[2]
    valid = (torch.arange(T, device=y.device)[None, :] < counts[:, None])[:, :, None]  # [B, T, 1]
    q = l2norm(y[..., :hk * dk].reshape(B, T, hk, dk)) * dk ** -0.5
    k = l2norm(y[..., hk * dk:2 * hk * dk].reshape(B, T, hk, dk))
    v = y[..., 2 * hk * dk:].reshape(B, T, hv, -1)
    beta = torch.sigmoid(b.float()) * valid
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float()) * valid
    return q, k, v, g, beta


def gdn_step_ref(
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor | None = None,
    *,
    num_k_heads: int,
    key_dim: int,
    want_out: bool = True,
) -> torch.Tensor | None:
    """kernels/gdn.py's `gdn_step` in torch: `gdn_inputs`, then `gdn_recurrent_ref`."""
    q, k, v, g, beta = gdn_inputs(
        y, a, b, A_log, dt_bias, counts, num_k_heads=num_k_heads, key_dim=key_dim
    )
    return gdn_recurrent_ref(q if want_out else None, k, v, g, beta, state, src, dst, reset, skip)


def gdn_replay_ref(
    y: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    rows: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    state: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor,
    *,
    num_k_heads: int,
    key_dim: int,
) -> None:
    """kernels/gdn.py's `gdn_replay` in torch: for each layer g, `gdn_step_ref` without output on
    y[g, rows], a[g, rows], b[g, rows] into state[g]."""
    for g in range(y.shape[0]):
        gdn_step_ref(
            y[g, rows],
            a[g, rows],
            b[g, rows],
            A_log[g],
            dt_bias[g],
            state[g],
            src,
            dst,
            reset,
            counts,
            skip,
            num_k_heads=num_k_heads,
            key_dim=key_dim,
            want_out=False,
        )


def commit_windows_ref(
    windows: torch.Tensor,
    x: torch.Tensor,
    rows: torch.Tensor,
    src: torch.Tensor,
    dst: torch.Tensor,
    reset: torch.Tensor,
    counts: torch.Tensor,
    skip: torch.Tensor,
) -> None:
    """The conv windows after the first counts[b] recorded inputs, for all layers at once.

    windows: [G, N, C, K-1]; x: [G, R, W, C] recorded conv inputs; rows: [B] their rows; src: [B]
    the window before them (zeros where reset[b]); dst: [B] where the result goes; rows with
    skip[b] keep windows[:, dst[b]]."""
    taps = windows.shape[3]
    before = torch.where(reset[None, :, None, None] != 0, 0, windows[:, src])  # [G, B, C, K-1]
    stream = torch.cat((before, x[:, rows].transpose(2, 3)), dim=3)  # [G, B, C, K-1+W]
    # (a skipped row may have fed more than W tokens: clamp its unused indices into range)
    idx = counts.clamp(max=x.shape[2])[:, None] + torch.arange(taps, device=x.device)  # [B, K-1]
    after = stream.gather(3, idx[None, :, None, :].expand(stream.shape[0], -1, stream.shape[2], -1))
    windows[:, dst] = torch.where(
        skip[None, :, None, None] != 0, windows[:, dst], after.to(windows.dtype)
    )
