"""The CPU chunked op for per-channel decays (GLA, KDA), on the chunk layout of `hybridlab.models.ops.common`.

:func:`per_channel_scores` computes the intra-chunk score matrices for per-channel decays (GLA, KDA),
``P[i, j] = sum_d x_id k_jd exp(b_id - b_jd)`` for ``j <= i``, with the secondary-chunking idea of
fla's kernels: the chunk is split into ``S`` sub-chunks of ``c`` tokens; a block of rows in sub-chunk
``s`` against all earlier columns factorises through the reference position ``r = s*c`` as
``(x_i exp(b_i - b_r)) . (k_j exp(b_r - b_j))`` (both factors <= 1, one batched matmul), and only the
``c x c`` diagonal blocks are formed element-wise. ``exp(b_r - b_j)`` for ``j`` in an earlier sub-chunk
``t`` is the product ``exp(b_r - b_e) exp(b_e - b_j)`` through ``t``'s last token ``e`` (both <= 1), so the
``[S, C, K]`` key factors cost multiplications, not exponentials.

:func:`chunk_per_channel` is the CPU op of GLA and KDA: a ``torch.autograd.Function`` whose forward
scans the chunks one at a time (each chunk's score factors, scores and products stay in cache, in
scratch buffers reused from chunk to chunk) and whose hand-written backward is the same scan in
reverse; the gradients of the scores are GEMMs over the same decay-scaled rows and keys, and the
log-decay gradient follows from ``db = x . dx - k . dk`` without products of its own.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridlab.models.ops.common import (
    Scratch,
    _addmm_,
    _bmm,
    from_chunks,
    pad_time,
    sub_chunk_size,
    to_chunks,
    unit_lower_inverse,
)


# Largest decay span b_r - b_e (first minus last token of a sub-chunk, any channel) for which the diagonal
# blocks go through the same GEMM as the rest (`_score_parts`): their key factor exp(b_r - b_j) is then at
# most e^30 ~ 1e13 and the row factor at least e^-30, both far inside fp32's range, so the product is as
# accurate as the element-wise form.
FOLD_SPAN = 30.0


def fold_size(b_ZCK: Tensor) -> int | None:
    """Longest sub-chunk (C, C/2, C/4 or `sub_chunk_size(C)`) over which no ``[Z, C, K]`` cumulative
    log-decay falls by more than ``FOLD_SPAN``, or None (the diagonal blocks then go element-wise)."""
    C = b_ZCK.shape[1]
    sizes = sorted({d for d in (C, C // 2, C // 4) if d > 1 and C % d == 0} | {sub_chunk_size(C)}, reverse=True)
    if b_ZCK.is_meta:  # no values (the memory plan traces shapes only): the one-GEMM path
        return sizes[0]
    for c in sizes:
        b_blk = b_ZCK.view(b_ZCK.shape[0], C // c, c, -1)
        if c > 1 and float((b_blk[:, :, 0] - b_blk[:, :, -1]).max()) <= FOLD_SPAN:
            return c
    return None


def _score_parts(b_ZCK: Tensor, ws: Scratch) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """Decay factors of :func:`per_channel_scores` for one ``[Z, C, K]`` slab of cumulative log-decays.

    With ``r_s`` / ``e_s`` the first / last token of sub-chunk s: ``row_scale [Z, S, c, K] = exp(b_i - b_r)``
    and ``col_scale [Z, S, c, K] = exp(b_e - b_j)`` (i, j in their own sub-chunk), ``link [Z, S, S, 1, K] =
    exp(b_{r_s} - b_{e_t})`` for ``t < s`` and 0 otherwise, so that ``exp(b_i - b_j) = row_scale_i link_st
    col_scale_j`` for i in s and j in an earlier sub-chunk t; and the diagonal blocks' ``decay [Z, S, c_i,
    c_j, K] = exp(b_i - b_j)`` for ``j <= i``, 0 elsewhere. Every exponent is ``<= 0`` (differences are
    clamped before ``exp`` and the masked entries zeroed after it, never ``exp(-inf)``: that is the slow
    path of the vectorised exp, ~6x its normal cost), so every factor lies in [0, 1].

    Folded diagonal (``decay`` is None): when no sub-chunk spans more than ``FOLD_SPAN`` of log-decay,
    ``link_ss = exp(b_{r_s} - b_{e_s}) >= 1`` is set too, so the diagonal blocks come out of the same GEMM
    as the earlier sub-chunks (``exp(b_i - b_j) = row_scale_i link_ss col_scale_j``, upper triangle masked
    afterwards) and the ``[Z, S, c, c, K]`` element-wise work is skipped. The sub-chunks are then as long
    as the span allows (`fold_size`: the whole chunk for mild decays, one GEMM per sequence). Stronger
    decays take the element-wise path, whose factors never exceed 1.
    """
    Z, C, K = b_ZCK.shape
    c = fold_size(b_ZCK)
    fold = c is not None
    c = c or sub_chunk_size(C)
    S = C // c
    b_blk = b_ZCK.view(Z, S, c, K)
    ref, last = b_blk[:, :, :1], b_blk[:, :, -1:]  # [Z, S, 1, K]
    row_scale = torch.sub(b_blk, ref, out=ws.get("row_scale", (Z, S, c, K), b_ZCK)).exp_()
    col_scale = torch.sub(last, b_blk, out=ws.get("col_scale", (Z, S, c, K), b_ZCK)).exp_()
    link = torch.sub(ref[:, :, None], last[:, None], out=ws.get("link", (Z, S, S, 1, K), b_ZCK))
    if fold:  # t <= s: exp(b_{r_s} - b_{e_t}), <= 1 for t < s and <= e^FOLD_SPAN on the diagonal
        link.clamp_max_(FOLD_SPAN).exp_().mul_(ws.mask(S, 0, b_ZCK)[:, :, None, None])
        return row_scale, col_scale, link, None
    link.clamp_max_(0.0).exp_().mul_(ws.mask(S, -1, b_ZCK)[:, :, None, None])
    # decay row by row: exp(b_i - b_j) = a_i exp(b_{i-1} - b_j) with a_i = exp(b_i - b_{i-1}) <= 1, so only
    # C x K exponentials instead of C x c x K (the exponential costs ~10 multiplications on CPU)
    a = torch.sub(b_blk[:, :, 1:], b_blk[:, :, :-1], out=ws.get("step", (Z, S, c - 1, K), b_ZCK)).exp_()
    decay = ws.get("decay", (Z, S, c, c, K), b_ZCK)
    decay[:, :, 0].zero_()
    decay[:, :, 0, 0].fill_(1.0)
    for i in range(1, c):  # row i - 1 is 0 beyond column i - 1, so row i is 0 beyond column i
        torch.mul(decay[:, :, i - 1], a[:, :, i - 1, None], out=decay[:, :, i])
        decay[:, :, i, i].fill_(1.0)
    return row_scale, col_scale, link, decay


def _key_cols(parts, k_ZCK: Tensor, ws: Scratch) -> Tensor:
    """``[Z, S, C, K]``: row s holds ``k_j exp(b_{r_s} - b_j)`` for columns j before sub-chunk s (and in it,
    when the diagonal is folded), else 0."""
    _, col_scale, link, _ = parts
    Z, S, c, K = col_scale.shape
    kc = torch.mul(k_ZCK.view(Z, S, c, K), col_scale, out=ws.get("k_col", (Z, S, c, K), k_ZCK))
    return torch.mul(link, kc[:, None], out=ws.get("k_cols", (Z, S, S, c, K), k_ZCK)).view(Z, S, S * c, K)


def _row_stack(parts, rows: list[Tensor], ws: Scratch) -> Tensor:
    """``[Z, S, R*c, K]``: each row set's sub-chunk rows scaled by ``exp(b_i - b_r)``, row sets stacked per sub-chunk."""
    row_scale = parts[0]
    Z, S, c, K = row_scale.shape
    x_rows = ws.get("x_rows", (Z, S, len(rows) * c, K), row_scale)
    for r, x in enumerate(rows):
        torch.mul(x.view(Z, S, c, K), row_scale, out=x_rows[:, :, r * c:(r + 1) * c])
    return x_rows


def _scores(parts, rows: list[Tensor], k_ZCK: Tensor, ws: Scratch, outs: list[Tensor] | None = None) -> list[Tensor]:
    """``[Z, C, C]`` per-channel scores of each ``[Z, C, K]`` row set against ``k`` (see :func:`per_channel_scores`).

    Written into ``outs`` when given (one ``[Z, C, C]`` tensor per row set).
    """
    row_scale, _, _, decay = parts
    Z, S, c, K = row_scale.shape
    C, R = S * c, len(rows)
    k_cols = _key_cols(parts, k_ZCK, ws).view(Z * S, C, K)
    x_rows = _row_stack(parts, rows, ws)
    off = ws.get("off", (Z, S, R * c, C), k_ZCK)  # blocks above (folded: after) the diagonal come out 0
    torch.bmm(x_rows.view(Z * S, R * c, K), k_cols.mT, out=off.view(Z * S, R * c, C))
    outs = [k_ZCK.new_empty(Z, C, C) for _ in rows] if outs is None else outs
    if decay is None:  # folded: row block s holds P's rows of sub-chunk s; mask the diagonal blocks' upper part
        tril = ws.mask(C, 0, k_ZCK).view(S, c, C)
        for r, out in enumerate(outs):
            torch.mul(off[:, :, r * c:(r + 1) * c], tril, out=out.view(Z, S, c, C))
        return outs
    k_dec = torch.mul(decay, k_ZCK.view(Z, S, 1, c, K), out=ws.get("k_dec", decay.shape, k_ZCK))  # [Z, S, c_i, c_j, K]
    tmp = ws.get("tmp5", decay.shape, k_ZCK)
    for r, (x, out) in enumerate(zip(rows, outs)):
        blocks = out.view(Z, S, c, S, c)
        blocks.copy_(off[:, :, r * c:(r + 1) * c].view(Z, S, c, S, c))
        diag = torch.mul(k_dec, x.view(Z, S, c, 1, K), out=tmp).sum(-1)  # [Z, S, c_i, c_j]
        blocks.diagonal(dim1=1, dim2=3).add_(diag.permute(0, 2, 3, 1))
    return outs


def _scores_backward(parts, rows: list[Tensor], k_ZCK: Tensor, grads: list[Tensor], ws: Scratch):
    """Hand-written backward of :func:`_scores`: ``(d rows, d k, d b)`` from the scores' gradients.

    Entries of ``grads`` above the diagonal are ignored (the factors there are exactly 0). With
    ``P_ij = sum_d x_id k_jd exp(b_id - b_jd)`` the log-decay gradient needs no products of its own:
    ``db = sum_rows x * dx - k * dk``.
    """
    row_scale, col_scale, link, decay = parts
    Z, S, c, K = row_scale.shape
    C, R = S * c, len(rows)
    k_cols = _key_cols(parts, k_ZCK, ws).view(Z * S, C, K)
    x_rows = _row_stack(parts, rows, ws)
    if decay is None:  # folded diagonal: its upper part must not reach the GEMMs
        tril = ws.mask(C, 0, k_ZCK).view(S, c, C)
        dP_off = ws.get("dP_off", (Z, S, R * c, C), k_ZCK)
        for r, g in enumerate(grads):
            torch.mul(g.view(Z, S, c, C), tril, out=dP_off[:, :, r * c:(r + 1) * c])
    elif R == 1:
        dP_off = grads[0].reshape(Z, S, c, C)
    else:
        dP_off = ws.get("dP_off", (Z, S, R * c, C), k_ZCK)
        for r, g in enumerate(grads):
            dP_off[:, :, r * c:(r + 1) * c] = g.view(Z, S, c, C)
    dP_flat = dP_off.reshape(Z * S, R * c, C)
    dx_off = torch.bmm(dP_flat, k_cols, out=ws.get("dx_off", (Z * S, R * c, K), k_ZCK))
    dx_off = dx_off.view(Z, S, R, c, K).mul_(row_scale[:, :, None])
    G = torch.bmm(dP_flat.mT, x_rows.view(Z * S, R * c, K), out=ws.get("G", (Z * S, C, K), k_ZCK))
    dk = G.view(Z, S, S, c, K).mul_(link).sum(1).mul_(col_scale).view(Z, C, K)
    if decay is None:  # folded: the GEMMs covered the diagonal blocks
        dxs = [dx_off[:, :, r].reshape(Z, C, K) for r in range(R)]
        db = k_ZCK * dk
        db.neg_()
        for x, dx in zip(rows, dxs):
            db.addcmul_(x, dx)
        return dxs, dk, db
    # diagonal blocks: element-wise (as batched products they would be 1024 tiny c x K matrices)
    k_dec = torch.mul(decay, k_ZCK.view(Z, S, 1, c, K), out=ws.get("k_dec", decay.shape, k_ZCK))
    tmp = ws.get("tmp5", decay.shape, k_ZCK)
    M = ws.get("M", decay.shape, k_ZCK)  # M_ijd = sum_rows dP_ij x_id
    dxs = []
    for r, (x, g) in enumerate(zip(rows, grads)):
        dP_diag = g.reshape(Z, S, c, S, c).diagonal(dim1=1, dim2=3).permute(0, 3, 1, 2)[..., None]  # [Z, S, c_i, c_j, 1]
        dx = torch.mul(k_dec, dP_diag, out=tmp).sum(3).add_(dx_off[:, :, r])  # [Z, S, c_i, K]
        dxs.append(dx.view(Z, C, K))
        x5 = x.view(Z, S, c, 1, K)
        if r == 0:
            torch.mul(dP_diag, x5, out=M)
        else:
            M.addcmul_(dP_diag, x5)
    dk += M.mul_(decay).sum(2).view(Z, C, K)
    db = k_ZCK * dk
    db.neg_()
    for x, dx in zip(rows, dxs):
        db.addcmul_(x, dx)
    return dxs, dk, db


def per_channel_scores(rows: list[Tensor], k_NZCK: Tensor, b_NZCK: Tensor) -> list[Tensor]:
    """For each ``x`` in ``rows``: ``P[i, j] = sum_d x_id k_jd exp(b_id - b_jd)`` for ``j <= i``, else 0.

    ``rows`` and ``k_NZCK`` are ``[..., C, K]`` (any leading dims), ``b_NZCK`` the within-chunk
    cumulative log-decay. Returns ``[..., C, C]`` matrices (lower triangle including the diagonal).
    Not differentiable by autograd (it writes into scratch buffers): the ops differentiate it by hand
    (:func:`_scores_backward`).
    """
    lead, (C, K) = k_NZCK.shape[:-2], k_NZCK.shape[-2:]
    flat = [x.reshape(-1, C, K) for x in rows]
    ws = Scratch()
    out = _scores(_score_parts(b_NZCK.reshape(-1, C, K), ws), flat, k_NZCK.reshape(-1, C, K), ws)
    return [p.view(*lead, C, C) for p in out]


# Element budget of one scratch buffer of the scores (32 MiB in fp32): the chunks' scores are formed in
# groups of chunks that keep the largest buffer under it, so strong decays (the element-wise diagonal path,
# ``[Z, S, c, c, K]`` buffers) on long batches do not allocate gigabytes.
SCORE_BUFFER_ELEMENTS = 1 << 23


def _chunk_groups(b: Tensor) -> list[slice]:
    """Slices of the chunk dim of ``b [N, Z, C, K]`` whose score buffers stay within ``SCORE_BUFFER_ELEMENTS``."""
    N, Z, C, K = b.shape
    c = fold_size(b.view(N * Z, C, K))
    per_chunk = Z * C * K * (C // c if c else sub_chunk_size(C))  # k_cols [Z, S, S, c, K] / decay [Z, S, c, c, K]
    step = max(1, SCORE_BUFFER_ELEMENTS // per_chunk)
    return [slice(n, min(n + step, N)) for n in range(0, N, step)]


def _pc_intra(q, k, g, beta, scale: float, C: int, ws: Scratch):
    """The intra-chunk terms of every chunk, in the chunk layout ``[N, Z, C, *]``: scaled queries, keys,
    cumulative log-decays ``b``, the scores ``P`` (and KDA's ``KK``, ``beta``, ``T``), formed for whole
    groups of chunks at once (`_chunk_groups`)."""
    qc = to_chunks(q, C, q.dtype).mul_(scale)
    kc, b = to_chunks(k, C, k.dtype), to_chunks(g, C, g.dtype).cumsum_(2)
    N, Z, _, K = kc.shape
    delta = beta is not None
    P = kc.new_empty(N, Z, C, C)
    KK = kc.new_empty(N, Z, C, C) if delta else None
    for sl in _chunk_groups(b):
        M = (sl.stop - sl.start) * Z
        rows = [qc[sl].view(M, C, K)] + ([kc[sl].view(M, C, K)] if delta else [])
        outs = [P[sl].view(M, C, C)] + ([KK[sl].view(M, C, C)] if delta else [])
        _scores(_score_parts(b[sl].view(M, C, K), ws), rows, kc[sl].view(M, C, K), ws, outs)
    betac = Tinv = None
    if delta:
        betac = to_chunks(beta, C, beta.dtype)[..., None]  # [N, Z, C, 1]
        Tinv = unit_lower_inverse(KK * betac)  # only the strict lower triangle is read
    return qc, kc, b, P, KK, betac, Tinv


def _pc_forward(q, k, v, g, beta, h0, scale: float, C: int, save: bool):
    """Chunked per-channel-decay forward (GLA: ``beta is None``) on fla-layout inputs, T a multiple of C.

    KDA (``beta`` given): ``A = strict_lower(beta_i scores(k, k))``, ``T = (I + A)^{-1}``,
    ``V_new = T (diag(beta) V - K_bg S)`` with ``K_bg = diag(beta) (exp(b) * K)``; GLA: ``V_new = V``.
    Both: ``O = (exp(b) * Q) S + P V_new``, ``S' = Diag(exp(b_C)) S + (exp(b_C - b) * K)^T V_new``.

    Everything that does not depend on the state (the scores ``P`` and ``KK``, ``T``, the decay-scaled
    rows) is computed for all chunks at once, as a few large batched products and element-wise passes;
    only the state recurrence runs chunk by chunk (two or three small products per chunk), and the
    output is one batched product over all chunks after it. With ``save`` it returns what the backward
    needs, in the chunk layout (so the backward does not redo the layout copies and the cumsum).
    """
    B, T, H, K = k.shape
    ws = Scratch()
    qc, kc, b, P, KK, betac, Tinv = _pc_intra(q, k, g, beta, scale, C, ws)
    N, Z = kc.shape[:2]
    vc = to_chunks(v, C, v.dtype)
    b_last = b[:, :, -1:]  # [N, Z, 1, K]
    decay = b_last.mT.exp()  # [N, Z, K, 1]: Diag(exp(b_C))
    Kd = torch.sub(b_last, b).exp_().mul_(kc)
    S_all = k.new_empty(N + 1, Z, K, vc.shape[-1])  # S_all[n] = state entering chunk n
    if h0 is None:
        S_all[0].zero_()
    else:
        S_all[0].copy_(h0)
    gam = b.exp()
    if beta is not None:
        Kbg = (gam * betac).mul_(kc)
        Vn = vc * betac  # V_b, then V_new = T X with X = V_b - K_bg S, chunk by chunk in place
        X = ws.get("X", Vn.shape[1:], Vn)
        for n in range(N):
            torch.baddbmm(Vn[n], Kbg[n], S_all[n], alpha=-1.0, out=X)
            torch.bmm(Tinv[n], X, out=Vn[n])
            torch.mul(S_all[n], decay[n], out=S_all[n + 1]).baddbmm_(Kd[n].mT, Vn[n])
    else:
        Vn = vc
        for n in range(N):
            torch.mul(S_all[n], decay[n], out=S_all[n + 1]).baddbmm_(Kd[n].mT, Vn[n])
    Qg = gam.mul_(qc)
    O = _bmm(P, Vn)
    _addmm_(O, Qg, S_all[:N])
    o = from_chunks(O, B, H, T)
    saved = (qc, kc, b, vc, betac, S_all, P, KK, Tinv, Vn) if save else None
    return o, S_all[N], saved


def _pc_backward(dO, dhT, saved, scale: float, shape: tuple[int, int, int]):
    """Hand-written backward of :func:`_pc_forward`, with the same split: the state gradients by a
    reverse scan (two or three small products per chunk), everything else for all chunks at once.

    ``dV_new = P^T dO + K_d dS'``; KDA: ``dX = T^T dV_new`` (``dv = beta dX``), ``dK_bg = -dX S^T``,
    ``dA = -strict_lower(dX V_new^T)``; ``dS = Diag(exp(b_C)) dS' + Q_g^T dO - K_bg^T dX``. The score
    gradients go through :func:`_scores_backward`; everything that depends on the decays lands in
    ``db`` (the within-chunk cumulative log-decay), whose reverse cumsum is ``dg``. ``shape`` is
    ``(B, H, T)`` of the fla-layout inputs; the gradients come back in that layout.
    """
    qc, kc, b, vc, betac, S_all, P, KK, Tinv, Vn = saved
    B, H, T = shape
    N, Z, C, K = kc.shape
    delta = betac is not None
    ws = Scratch()
    dOc = to_chunks(dO, C, dO.dtype)
    b_last = b[:, :, -1:]
    decay = b_last.mT.exp()
    gam = b.exp()
    e_d = torch.sub(b_last, b).exp_()
    Kd = e_d * kc
    Qg = gam * qc
    gb = gam * betac if delta else None
    Kbg = gb * kc if delta else None
    # reverse scan: dS_all[n] = gradient of the state entering chunk n
    dS_all = torch.empty_like(S_all)
    if dhT is None:
        dS_all[N].zero_()
    else:
        dS_all[N].copy_(dhT.reshape(Z, K, -1))
    dVn = _bmm(P.mT, dOc)  # P^T dO, then + K_d dS' per chunk
    QdO = _bmm(Qg.mT, dOc)  # Q_g^T dO
    dX = torch.empty_like(dVn) if delta else None
    for n in range(N - 1, -1, -1):
        dS = dS_all[n + 1]
        dVn[n].baddbmm_(Kd[n], dS)
        torch.mul(dS, decay[n], out=dS_all[n]).add_(QdO[n])
        if delta:
            torch.bmm(Tinv[n].mT, dVn[n], out=dX[n])
            dS_all[n].baddbmm_(Kbg[n].mT, dX[n], alpha=-1.0)
    S_in, dS_out = S_all[:N], dS_all[1:]
    dP = _bmm(dOc, Vn.mT)  # only its lower triangle is read
    dQg = _bmm(dOc, S_in.mT)
    dKd = _bmm(Vn, dS_out.mT)
    d_last = torch.linalg.vecdot(S_in, dS_out).mul_(decay[..., 0])  # through Diag(exp(b_C)) S, [N, Z, K]

    dKK = None
    if delta:
        dv = dX * betac
        dbeta = torch.linalg.vecdot(dX, vc)
        ndKbg = _bmm(dX, S_in.mT)  # -dK_bg
        ndA = _bmm(dX, Vn.mT).tril_(-1)  # -dA (strict lower)
        dbeta -= torch.linalg.vecdot(ndA, KK)
        dKK = ndA.mul_(betac).neg_()
    # the score gradients, group by group (the decay factors are element-wise and cheap: recomputed, not saved)
    groups = _chunk_groups(b)
    parts = [], [], []  # dq, dk, db per group
    for sl in groups:
        Mg = (sl.stop - sl.start) * Z
        rows = [qc[sl].view(Mg, C, K)] + ([kc[sl].view(Mg, C, K)] if delta else [])
        grads = [dP[sl].view(Mg, C, C)] + ([dKK[sl].view(Mg, C, C)] if delta else [])
        dxs, dk_g, db_g = _scores_backward(_score_parts(b[sl].view(Mg, C, K), ws), rows, kc[sl].view(Mg, C, K),
                                           grads, ws)
        if delta:  # k enters as a row set and as the keys
            dk_g += dxs[1]
        # dxs may be views of the scratch buffers, which the next group reuses
        dq_g = dxs[0] if len(groups) == 1 else dxs[0].clone()
        for acc, x in zip(parts, (dq_g, dk_g, db_g)):
            acc.append(x.view(-1, Z, C, K))
    dq_s, dk_s, db_s = (acc[0] if len(acc) == 1 else torch.cat(acc) for acc in parts)
    if delta:
        dk_s.addcmul_(ndKbg, gb, value=-1.0)
        dbeta -= torch.linalg.vecdot(ndKbg, gam * kc)
        db_s.addcmul_(ndKbg, Kbg, value=-1.0)
        dbeta = from_chunks(dbeta[..., None], B, H, T)[..., 0]
    else:
        dv, dbeta = dVn, None
    db_s.addcmul_(dQg, Qg)
    dq_s.addcmul_(dQg, gam).mul_(scale)  # q entered scaled
    dk_s.addcmul_(dKd, e_d)
    kd_term = dKd.mul_(Kd)
    db_s -= kd_term
    db_s[:, :, -1] += kd_term.sum(2) + d_last
    dg = torch.cumsum(db_s.flip(2), dim=2).flip(2)  # reverse cumsum of db within the chunk
    dq, dk, dv, dg = (from_chunks(x, B, H, T) for x in (dq_s, dk_s, dv, dg))
    return dq, dk, dv, dg, dbeta, dS_all[0]


class _PerChannelChunk(torch.autograd.Function):
    """Chunked GLA (``beta=None``) / KDA on fla-layout inputs, with :func:`_pc_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, h0, scale, C):
        o, hT, saved = _pc_forward(q, k, v, g, beta, h0, scale, C, save=True)
        B, T, H = k.shape[:3]
        ctx.delta, ctx.has_h0, ctx.scale, ctx.shape = beta is not None, h0 is not None, scale, (B, H, T)
        ctx.save_for_backward(*saved)
        return o, hT

    @staticmethod
    def backward(ctx, dO, dhT):
        dq, dk, dv, dg, dbeta, dh0 = _pc_backward(dO, dhT, ctx.saved_tensors, ctx.scale, ctx.shape)
        return dq, dk, dv, dg, dbeta, (dh0 if ctx.has_h0 else None), None, None


def chunk_per_channel(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor | None, h0: Tensor | None,
                      scale: float, chunk_size: int) -> tuple[Tensor, Tensor]:
    """Chunked GLA (``beta=None``) or KDA in fla's layout; ``(o [B, T, H, V], S [B*H, K, V])``.

    ``q`` is unscaled (``scale`` is applied in the chunk layout), ``g`` the per-channel log-decay, ``h0`` is
    ``[B*H, K, V]`` or None; T need not be a multiple of ``chunk_size`` (neutral right-padding). Under
    autograd it runs as one ``autograd.Function`` with a hand-written backward.
    """
    T, C = q.shape[1], chunk_size
    args = [pad_time(x, C) if x is not None else None for x in (q, k, v, g, beta)] + [h0]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args):
        o, hT = _PerChannelChunk.apply(*args, scale, C)
    else:
        o, hT, _ = _pc_forward(*args, scale, C, save=False)
    if o.shape[1] != T:  # only when padded
        o = o[:, :T]
    return o, hT
