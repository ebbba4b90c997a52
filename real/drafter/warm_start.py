"""A closed-form warm start for the vLLM-architecture drafter (real/drafter/qwen3_dspark.py): layer 0 set so the
first slot starts at a ridge regression of the target's next state, in weights vLLM's `Qwen3DSparkModel` loads.

Why: from a random init the block reaches the target's states only through attention over a random `fc` and
random q/k, so slot 0 starts near chance (first-slot accuracy about 0.01) and a CPU budget of updates barely
moves it. Here slot 0 starts where a linear map of the target's own states puts it.

Notation as real/drafter/qwen3_dspark.py; x_j = s * h_j (the training scale, `in_scale`), y(e) = the layer's
input norm of an embedding e with dimension 0 zeroed (input_norm weight 0 there), D the hidden size, hd the head
size, G the KV heads (3 here; heads 0..2G/3-1 "context", the last group "anchor").

  target      Y_a = h^{last}_a / RMS(h^{last}_a): the target's normed final residual at position a, whose LM head
              output (times the final-norm weight) is the target's distribution for t_{a+1}, slot 0's label
  regression  Y_a ~ beta E[t_a] + A n_{a-1} + B y(E[t_a])   (ridge, beta a scalar because E[t_a] enters the
              block's residual stream with weight 1), then A cut to rank (G-1) hd and B to rank hd by the SVD of
              their fitted values (reduced-rank regression), refitted in turn; the ridge's lambda (times N) chosen
              among `lams` by the top-1 agreement with the target on every tenth sequence, held out of the fit
  fc          c = e_0 (mu . x) + Q P x: row 0 a direction mu with mu . x > 0 on (nearly) every training position
              (found as `positive_direction` finds one; the share is reported), the others the top principal
              directions P of x written into Q, an orthonormal basis
              of {e_0, w2}^perp: so n_0 > 0 on every context and w2 . n = 0
  keys        context groups: k = k_norm(u (e_0 . n)) = u * const for every context (n_0 > 0), 0 for the block
              (y_0 = 0); anchor group: k = k_norm(u (w2 . y)) = u * const for the anchor's input (w2 . y > 0 on
              99% or more of the vocabulary, reported) and 0 for contexts and for the mask token (w2 ⊥ y(E[mask]))
  queries     q_h = q_norm(R_{-d} u (w_q . y)) (w_q . y > 0 on the vocabulary and the mask): RoPE makes the score
              of a key at distance D_ = pos_q - pos_k a sum over the 32 frequency pairs of cos(theta_i (D_ - d)),
              which peaks at D_ = d (a Dirichlet-like kernel): d = 1 for the context heads (slot 0 reads position
              a - 1), d = 0 for the anchor heads (slot 0 reads itself; slot k >= 1 reads the anchor, the only
              non-zero anchor-group key it sees). `sharp` scales q_norm and k_norm so the peak beats every other
              distance up to 4096 by at least `margin` nats
  values      context groups W_v = (top (G-1) hd output directions of A)^T A / beta, anchor group likewise for B;
              o_proj spreads each group's directions over its heads (1 / heads per group each)
  the rest    MLP out (down_proj) 0, later layers' o_proj and down_proj 0, the final norm = the target's: slot 0's
              residual is E[t_a] + (A n + B y) / beta ~ Y_a / beta, whose RMS-normed image is the target's state
Markov head and confidence head keep their init (W2 = 0, confidence 0.5). Units: dimensionless (states are
RMS-normed); margins in nats of attention logit.
"""
from __future__ import annotations

import math

import torch

from real.drafter.train import final_state, sample_anchors
from sim.infra.errors import ConfigError


def positive_direction(X: torch.Tensor, orth: torch.Tensor | None = None,
                       iters: int = 300) -> tuple[torch.Tensor, float]:
    """A unit w with w . x > 0 for as many rows of X [N, D] as a softplus-margin descent finds, w orthogonal to
    the columns of `orth` [D, m]. Returns (w, share of rows with w . x > 0)."""
    def project(v):
        if orth is not None:
            q, _ = torch.linalg.qr(orth)
            v = v - q @ (q.T @ v)
        return v / v.norm().clamp(min=1e-12)

    Xn = X / X.norm(dim=1, keepdim=True).clamp(min=1e-12)
    with torch.enable_grad():  # callers run under no_grad
        w = project(Xn.mean(0)).requires_grad_(True)
        opt = torch.optim.Adam([w], lr=0.02)
        for _ in range(iters):
            opt.zero_grad()
            torch.nn.functional.softplus(-40.0 * (Xn @ (w / w.norm()))).mean().backward()
            opt.step()
            with torch.no_grad():
                w.copy_(project(w))
    w = w.detach()
    return w, float((Xn @ w > 0).float().mean())


def rope_kernel(theta: float, hd: int, d: int, max_dist: int = 4096) -> torch.Tensor:
    """f(D) = sum_i cos(theta_i (D - d)) for D = 0..max_dist, theta_i = theta^(-2i/hd): the score shape."""
    inv = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    D = torch.arange(max_dist + 1, dtype=torch.float64)
    return torch.cos((D[:, None] - d) * inv[None, :]).sum(-1)


def _rrr(F: torch.Tensor, W: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reduced-rank factors of a fitted map W [D_out, D_in] with fitted values F [N, D_out]: (U [D_out, r],
    M [r, D_in]) with U M the rank-r map whose fitted values are F's best rank-r approximation."""
    _, _, Vh = torch.linalg.svd(F, full_matrices=False)
    U = Vh[:rank].T
    return U, U.T @ W


def _ridge(X: torch.Tensor, Y: torch.Tensor, lam: float) -> torch.Tensor:
    """W [D_out, D_in] minimising |Y - X W^T|^2 + lam N |W|^2 (X [N, D_in], Y [N, D_out])."""
    G = X.T @ X + lam * X.shape[0] * torch.eye(X.shape[1], dtype=X.dtype)
    return torch.linalg.solve(G, X.T @ Y).T


def _fit(n, Yb, Ea, Y, lam: float, rank_a: int, rank_b: int, factors: bool = False):
    """The module docstring's regression: (beta, A, B) with A of rank `rank_a`, B of rank `rank_b` (and their
    factors when asked)."""
    Z = torch.cat([n, Yb], 1)
    D = n.shape[1]
    beta = float((Y * Ea).sum() / (Ea * Ea).sum())
    for _ in range(3):
        W = _ridge(Z, Y - beta * Ea, lam)
        beta = float(((Y - Z @ W.T) * Ea).sum() / (Ea * Ea).sum())
    A, B = W[:, :D], W[:, D:]
    UA, MA = _rrr(n @ A.T, A, rank_a)
    A = UA @ MA
    for _ in range(2):
        B = _ridge(Yb, Y - beta * Ea - n @ A.T, lam)
        UB, MB = _rrr(Yb @ B.T, B, rank_b)
        B = UB @ MB
        beta = float(((Y - n @ A.T - Yb @ B.T) * Ea).sum() / (Ea * Ea).sum())
    return (beta, A, B, UA, MA, UB, MB) if factors else (beta, A, B)


@torch.no_grad()
def warm_start(d, seqs, target_norm_weight: torch.Tensor, max_positions: int = 40000,
               lams: tuple[float, ...] = (1e-4, 1e-3, 1e-2, 1e-1), margin: float = 12.0, seed: int = 0,
               log=print) -> dict:
    """Set layer 0 (and zero the later layers' residual branches) of DSparkV `d` as the module docstring says,
    from the training sequences `seqs` (real/drafter/train.SeqTensors). `d.in_scale` must be set. Returns the
    fit's figures (beta, R^2 of the rank-cut fit, the directions' positive shares, the attention margin)."""
    cfg = d.cfg
    D, hd, G, H = cfg.hidden, cfg.head_dim, cfg.kv_heads, cfg.heads
    if G < 2:
        raise ConfigError("warm start: needs at least 2 KV heads (context and anchor groups)")
    if d.embed is None or d.in_scale is None:
        raise ConfigError("warm start: attach_target and set in_scale first")
    gen = torch.Generator().manual_seed(seed)
    per = max(1, max_positions // max(len(seqs), 1))
    Xs, Ys, toks, sid = [], [], [], []
    for i, st in enumerate(seqs):
        ok = sample_anchors(st, per, gen, stop=st.feats.shape[0])   # a in 1..C-1 with a slot-0 label
        if len(ok) == 0:
            continue
        Xs.append(st.feats[ok - 1].float() * d.in_scale)
        Ys.append(final_state(st, ok, D))
        toks.append(st.tokens[ok])
        sid.append(torch.full((len(ok),), i))
    if not Xs:
        raise ConfigError("warm start: no labelled position in the training sequences")
    X, Y, t = torch.cat(Xs).double(), torch.cat(Ys).double(), torch.cat(toks)
    E = d.embed.double()

    def y_in(e):  # the block's input norm with dimension 0 zeroed
        v = e / e.pow(2).mean(-1, keepdim=True).add(cfg.rms_eps).sqrt()
        v = v.clone()
        v[..., 0] = 0
        return v

    Yin_vocab = y_in(E)
    mask_y = Yin_vocab[cfg.mask_token_id]
    e0 = torch.zeros(D, dtype=torch.float64)
    e0[0] = 1
    # the directions must be positive on the anchors as they occur (frequent tokens weigh) and on the vocabulary
    occ = torch.cat([Yin_vocab[t], Yin_vocab])[:, 1:].float()
    w_q, q_share = positive_direction(torch.cat([occ, mask_y[None, 1:].float().expand(64, -1)]))
    w_q = torch.cat([torch.zeros(1), w_q]).double()
    w2, a_share = positive_direction(occ, orth=mask_y[1:, None].float())
    w2 = torch.cat([torch.zeros(1), w2]).double()
    if float(w_q @ mask_y) <= 0:
        raise ConfigError("warm start: no query direction positive on the mask token's embedding")
    anchor_pos = float((Yin_vocab[t] @ w2 > 0).double().mean())
    q_pos = float((Yin_vocab[t] @ w_q > 0).double().mean())

    # fc: row 0 the mean direction, the rest the top principal directions written into {e_0, w2}^perp
    mu, ctx_pos = positive_direction(X.float())
    mu = mu.double()
    Xc = X - (X @ mu)[:, None] * mu[None, :]
    _, _, Vh = torch.linalg.svd(Xc - Xc.mean(0), full_matrices=False)
    P = Vh[: D - 2]                                                      # [D-2, L*D]
    basis = torch.linalg.qr(torch.cat([e0[:, None], w2[:, None], torch.randn(D, D - 2, generator=gen,
                                                                              dtype=torch.float64)], 1))[0]
    Q = basis[:, 2:]                                                     # [D, D-2], orthogonal to e_0 and w2
    W_fc = e0[:, None] * mu[None, :] * (X @ mu).std().clamp(min=1e-6).reciprocal() * 3.0 + Q @ P
    c = X @ W_fc.T
    n = c / c.pow(2).mean(-1, keepdim=True).add(cfg.rms_eps).sqrt()
    Ea, Yb = E[t], Yin_vocab[t]

    # the regression, then the rank cuts (context groups: (G-1) hd; anchor group: hd); lambda chosen by the
    # top-1 agreement with the target on every tenth sequence, held out of the fit
    wf = target_norm_weight.double()
    hold = torch.cat(sid) % 10 == 9                 # whole sequences: neighbouring positions would leak
    if not hold.any() or hold.all():
        hold = torch.arange(X.shape[0]) % 10 == 9
    scores = {}
    for lam_try in lams:
        fitted = _fit(n[~hold], Yb[~hold], Ea[~hold], Y[~hold], lam_try, (G - 1) * hd, hd)
        pred = fitted[0] * Ea[hold] + n[hold] @ fitted[1].T + Yb[hold] @ fitted[2].T
        scores[lam_try] = float((((pred * wf) @ E.T).argmax(-1) == ((Y[hold] * wf) @ E.T).argmax(-1)).double().mean())
    lam = max(scores, key=scores.get)
    beta, A, B, UA, MA, UB, MB = _fit(n, Yb, Ea, Y, lam, (G - 1) * hd, hd, factors=True)
    if beta <= 1e-3:
        raise ConfigError(f"warm start: the anchor embedding's weight in the fit is {beta:.2e} (needs > 0)")
    fit = beta * Ea + n @ A.T + Yb @ B.T
    r2 = 1 - float((Y - fit).pow(2).sum() / (Y - Y.mean(0)).pow(2).sum())

    # attention: a Dirichlet-like RoPE kernel peaked at distance 1 (context heads) or 0 (anchor heads)
    f1 = rope_kernel(cfg.rope_theta, hd, 1)
    gap = float(f1[1] - torch.cat([f1[2:], f1[:1]]).max())
    half = hd // 2
    # per pair: |q| = sqrt(2) a_q, |k| = sqrt(2) a_k (unit pair amplitude over RMS sqrt(1/2) for q, a half-filled
    # u for k), score = 2 a_q a_k cos / sqrt(hd); the gap of f1 times that clears `margin`
    aqak = margin * math.sqrt(hd) / (2 * gap)
    a = math.sqrt(aqak)
    u = torch.zeros(hd, dtype=torch.float64)
    u[:half] = 1.0

    def rotated(dist: int) -> torch.Tensor:  # R_{-dist} u in the rotate-half layout: the query peaking at dist
        inv = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
        ang = -dist * inv
        return torch.cat([torch.cos(ang), torch.sin(ang)])

    L0 = d.blocks[0]
    per_group = H // G
    qw = torch.zeros(H * hd, D, dtype=torch.float64)
    for h in range(H):
        qw[h * hd:(h + 1) * hd] = rotated(1 if h // per_group < G - 1 else 0)[:, None] * w_q[None, :]
    kw = torch.zeros(G * hd, D, dtype=torch.float64)
    vw = torch.zeros(G * hd, D, dtype=torch.float64)
    ow = torch.zeros(D, H * hd, dtype=torch.float64)
    for g in range(G):
        kw[g * hd:(g + 1) * hd] = u[:, None] * (e0 if g < G - 1 else w2)[None, :]
        if g < G - 1:
            vw[g * hd:(g + 1) * hd] = MA[g * hd:(g + 1) * hd] / beta
            cols = UA[:, g * hd:(g + 1) * hd]
        else:
            vw[g * hd:(g + 1) * hd] = MB / beta
            cols = UB
        for h in range(g * per_group, (g + 1) * per_group):
            ow[:, h * hd:(h + 1) * hd] = cols / per_group
    dt = L0.q_proj.weight.dtype
    L0.q_proj.weight.copy_(qw.to(dt))
    L0.k_proj.weight.copy_(kw.to(dt))
    L0.v_proj.weight.copy_(vw.to(dt))
    L0.o_proj.weight.copy_(ow.to(dt))
    L0.q_norm.weight.fill_(a)
    L0.k_norm.weight.fill_(a)                    # shared by every layer under shared_k_norm
    L0.input_norm.weight.fill_(1.0)
    L0.input_norm.weight[0] = 0.0
    L0.post_norm.weight.fill_(1.0)
    L0.down_proj.weight.zero_()
    for b in d.blocks[1:]:
        b.o_proj.weight.zero_()
        b.down_proj.weight.zero_()
    d.fc.weight.copy_(W_fc.to(dt))
    d.hidden_norm.weight.fill_(1.0)
    d.norm.weight.copy_(target_norm_weight.to(d.norm.weight))
    stats = {"positions": int(X.shape[0]), "lambda": lam, "beta": round(beta, 4), "r2": round(r2, 4),
             "fit_top1_vs_target": round(scores[lam], 4),  # positions held out of the fit
             "context_positive": round(ctx_pos, 4),
             "query_positive_vocab": round(q_share, 4), "anchor_positive_vocab": round(a_share, 4),
             "anchor_positive_positions": round(anchor_pos, 4), "query_positive_positions": round(q_pos, 4),
             "attention_margin_nats": margin,
             "qk_norm_weight": round(a, 3)}
    log("warm start: " + ", ".join(f"{k} {v}" for k, v in stats.items()))
    return stats


__all__ = ["warm_start", "positive_direction", "rope_kernel"]
