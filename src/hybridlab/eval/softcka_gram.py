"""Sentence Gram matrices for SoftCKA: the mean-RBF set kernel between sentences, its median-heuristic
bandwidth, the exact path and the random-Fourier-feature approximation (definitions in
`hybridlab.eval.softcka` and docs/methods.md, "SoftCKA and pair alignment").

Exact path. Each distinct token vector is one row of the layout: a causal model gives sentences that
start with the same tokens bit-identical states there, and layer 0 is one embedding row per token id.
Rows are cut into blocks of `block_tokens`; each block has a sparse [sentences, rows] count matrix (how
often each vector occurs in each sentence), so a block's kernel terms are summed per sentence pair by
two sparse products. Vectors private to one sentence come first in token order (a block then covers a
few consecutive sentences), vectors found in >= 2 sentences ("shared") follow. The sums hold the same
terms as over all token pairs, added in another order, and the work shrinks by the square of the
fraction of distinct rows. For each pair of blocks (upper block triangle only) ONE fp32 GEMM of
augmented rows l_a = log2(e) [2a, -|a|^2, -1] and r_b = [b, 1, |b|^2] gives -log2(e) ||a - b||^2 for
every row pair and exp2 turns it into the kernel block (no padding: a sentence may straddle two blocks);
a block small enough for cache keeps the GEMM output there while it is exponentiated and reduced.
Vectors are mean-centred first (distances do not change) to limit cancellation in the expansion: the
exponent's absolute error is ~1e-7 (|a'|^2 + |b'|^2) in bandwidth units, negligible unless two
near-identical tokens lie hundreds of sigmas from the mean (massive activations; special tokens are
dropped by the capture anyway).
exp2 rather than exp, and its argument clamped at -126 (`MIN_LOG2_KERNEL`), because far token pairs
give large negative exponents whose denormal or zero results are slow on x86 CPUs; on CPU the GEMM goes
through oneDNN (`torch.ops.mkldnn._linear_pointwise`, the clamp fused into it, the same fp32 math) where
torch has it (`_onednn_gemm_available`), else `torch.mm`. Runs on any torch device. Cost ~ U^2 (D + 2) / 2
fp32 multiply-adds per language (U rows after deduplication, at most the T tokens);
`benchmarks/softcka.py` measures it against its GEMM floor and the model's forward pass (figures in
docs/performance.md). The RFF path costs ~ T D F (one GEMM, F cos/sin per token) plus the shared
median heuristic.

Approximate path (random Fourier features, Rahimi & Recht 2007): phi(a) = F'^-1/2 [cos(W a), sin(W a)]
with columns w_f ~ N(0, sigma^-2 I), F = 2 F' features, so phi(a).phi(b) = mean_f cos(w_f.(a - b)) is an
unbiased estimate of the RBF kernel bounded in [-1, 1]; the kernel mean embedding of a sentence is the
mean of phi over its tokens and K_rff = Phi Phi^T. With i.i.d. w_f each entry is a mean of F' i.i.d.
terms in [-1, 1], so by Hoeffding and a union bound over the N^2 entries,
max |K_rff - K| <= sqrt(2 ln(2 N^2 / delta) / F') with probability >= 1 - delta (`rff_error_bound`).
The default draws orthogonal random features (Yu et al. 2016), which are still unbiased and have
lower variance for the RBF kernel (a smaller max error and a less biased CKA in the tests); the
bound is proven for i.i.d. features only and is checked empirically for both in the tests. Both
languages use the same seed, so identical inputs give SoftCKA = 1 exactly on this path too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch

from hybridlab.errors import HybridlabError

TokenSets = Sequence[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]

MEDIAN_PAIRS = 100_000
SIGMA_CONVENTIONS = ("median_distance", "median_sq_distance")


def check_sigma_convention(convention: str) -> None:
    if convention not in SIGMA_CONVENTIONS:
        raise HybridlabError(f"unknown sigma_convention {convention!r}; use 'median_distance' (sigma = median "
                             "distance) or 'median_sq_distance' (2 sigma^2 = median squared distance)")


def flatten_sets(sets: TokenSets) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat [T, D], offsets [N+1]) from a list of per-sentence [n_i, D] tensors or such a pair."""
    if isinstance(sets, tuple) and len(sets) == 2 and sets[1].dim() == 1 and sets[0].dim() == 2:
        flat_TD, offsets_N1 = sets
        _check_offsets(flat_TD, offsets_N1)
        return flat_TD, offsets_N1.to(torch.long)
    sets = list(sets)
    if not sets:
        raise HybridlabError("SoftCKA got no sentences; pass at least 4 token sets per language")
    for i, s in enumerate(sets):
        if s.dim() != 2 or s.shape[0] == 0:
            raise HybridlabError(f"sentence {i} has token tensor of shape {tuple(s.shape)}; each sentence "
                                 "needs a non-empty [n_tokens, D] tensor")
    lengths_N = torch.tensor([s.shape[0] for s in sets], dtype=torch.long)
    offsets_N1 = torch.zeros(len(sets) + 1, dtype=torch.long)
    offsets_N1[1:] = lengths_N.cumsum(0)
    return torch.cat(list(sets), dim=0), offsets_N1


def _check_offsets(flat_TD: torch.Tensor, offsets_N1: torch.Tensor) -> None:
    if flat_TD.dim() != 2:
        raise HybridlabError(f"token vectors must be [T, D], got shape {tuple(flat_TD.shape)}")
    if offsets_N1.numel() < 2 or int(offsets_N1[0]) != 0 or int(offsets_N1[-1]) != flat_TD.shape[0]:
        raise HybridlabError("offsets must start at 0 and end at the token count (offsets[i]:offsets[i+1] "
                             "are sentence i's rows); rebuild them from the per-sentence lengths")
    if bool((offsets_N1[1:] <= offsets_N1[:-1]).any()):
        raise HybridlabError("offsets must be strictly increasing: every sentence needs at least one token")


def median_sigma(token_vecs_TD: torch.Tensor, *, median_pairs: int = MEDIAN_PAIRS, seed: int = 0,
                 convention: str = "median_distance") -> float:
    """RBF bandwidth from the token pairs of distinct positions (all pairs, or all pairs of a seeded token
    sample): the median distance ("median_distance") or sqrt(median squared distance / 2)
    ("median_sq_distance", i.e. 2 sigma^2 = median ||a - b||^2)."""
    check_sigma_convention(convention)
    T = token_vecs_TD.shape[0]
    if T < 2:
        raise HybridlabError("the median-heuristic bandwidth needs at least 2 tokens in a language")
    x_TD = token_vecs_TD.float()
    if T * (T - 1) // 2 > median_pairs:
        # all pairs among a seeded uniform subsample of m tokens, m(m-1)/2 >= median_pairs: one small
        # exact pdist instead of gathering `median_pairs` random row pairs (the same estimator up to the
        # dependence between pairs that share a token, and one contiguous kernel instead of a gather)
        m = math.ceil((1.0 + math.sqrt(1.0 + 8.0 * median_pairs)) / 2.0)
        keep_M = torch.randperm(T, generator=torch.Generator().manual_seed(seed))[:m]
        x_TD = x_TD.index_select(0, keep_M.to(x_TD.device))
    dist_P = torch.pdist(x_TD)
    if convention == "median_distance":
        sigma = float(dist_P.median())
    else:
        sigma = math.sqrt(float((dist_P.double() ** 2).median()) / 2.0)
    if not sigma > 0.0 or not math.isfinite(sigma):
        raise HybridlabError(f"median token distance is {sigma}; the vectors are (mostly) identical or "
                             "non-finite, so the RBF bandwidth is undefined - check the captured states")
    return sigma


LOG2E = 1.0 / math.log(2.0)
# exp2's argument is clamped below at -126: a kernel value under 2^-126 (~1.2e-38, fp32's smallest normal number)
# counts as 2^-126, an absolute change below 1.2e-38 per token pair, and no result is denormal (slow on x86:
# docs/performance.md, "Denormal kernel values"). The upper clamp only keeps the post-op's range finite.
MIN_LOG2_KERNEL, MAX_LOG2_KERNEL = -126.0, 126.0


def _onednn_gemm_available(dev: torch.device) -> bool:
    """Whether the CPU GEMMs of the Gram paths go through oneDNN (its AVX-512 kernels run on every x86
    vendor, and it fuses the clamp); the same fp32 math as torch.mm."""
    return (dev.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _distinct_rows(x_TD: torch.Tensor) -> torch.Tensor:
    """vec_T [T]: an id per distinct row (bit-identical rows share one, ids 0..U-1 in order of first row).

    Rows are grouped by a float64 random projection (one GEMV + a 1-D sort instead of the
    lexicographic `torch.unique(dim=0)`), then every row is compared with its group's first row: a row
    that differs (a projection collision) gets an id of its own, so different vectors never share an id.
    """
    T, D = x_TD.shape
    w_D = torch.randn(D, generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(x_TD.device)
    _, group_T = torch.unique(x_TD.double() @ w_D, return_inverse=True)
    row_T = torch.arange(T, device=x_TD.device)
    first_G = torch.full((int(group_T.max()) + 1,), T, device=x_TD.device).scatter_reduce_(0, group_T, row_T, "amin")
    rep_T = first_G[group_T]
    rep_T = torch.where((x_TD == x_TD[rep_T]).all(1), rep_T, row_T)
    return torch.unique(rep_T, return_inverse=True)[1]


@dataclass(frozen=True)
class _GramBlock:
    """Layout rows start:stop and `counts`, the sparse [hi - lo, rows] matrix of how often each row's
    vector occurs in each of the sentences lo..hi-1 (the only ones it occurs in)."""

    start: int
    stop: int
    lo: int
    hi: int
    counts: torch.Tensor

    def sum_rows(self, e_RC: torch.Tensor) -> torch.Tensor:
        """[rows, C] kernel terms -> [sentences, C]: each sentence's sum over its tokens."""
        return torch.sparse.mm(self.counts, e_RC)

    def sum_cols(self, r_AR: torch.Tensor) -> torch.Tensor:
        """[A, rows] -> [A, sentences], the same sums over the column axis."""
        return torch.sparse.mm(self.counts, r_AR.T.contiguous()).T  # contiguous: sparse.mm is slow on the strided view


def _gram_layout(x_TD: torch.Tensor, lengths_N: torch.Tensor, block_tokens: int
                 ) -> tuple[torch.Tensor, list[_GramBlock]]:
    """(row_R, blocks): layout row r holds token row row_R[r]'s vector; each distinct vector has ONE row.

    A vector found in >= 2 sentences (a shared prefix of a causal model, an embedding row) is "shared".
    The private vectors come first: their ids follow the token order, so `block_tokens` consecutive rows
    belong to a few consecutive sentences and a block's sentence range is short. The shared ones follow,
    `block_tokens` per block (their ranges can span the corpus; there are few of them).
    """
    dev = x_TD.device
    T, N = x_TD.shape[0], lengths_N.numel()
    vec_T = _distinct_rows(x_TD)
    U = int(vec_T.max()) + 1
    sent_T = torch.repeat_interleave(torch.arange(N, device=dev), lengths_N)
    vec_sent_P, count_P = torch.unique(vec_T * N + sent_T, return_counts=True)  # distinct (vector, sentence)
    vec_P, sent_P = vec_sent_P // N, vec_sent_P % N
    shared_U = torch.bincount(vec_P, minlength=U) >= 2
    order_U = torch.cat([torch.nonzero(~shared_U).flatten(), torch.nonzero(shared_U).flatten()])
    layout_U = torch.empty_like(order_U)
    layout_U[order_U] = torch.arange(U, device=dev)
    row_P, by_row = torch.sort(layout_U[vec_P], stable=True)
    sent_P, count_P = sent_P[by_row], count_P[by_row].to(torch.float32)
    n_private = int((~shared_U).sum())
    starts = [*range(0, n_private, block_tokens), *range(n_private, U, block_tokens), U]
    cuts = torch.searchsorted(row_P, torch.tensor(starts, device=dev)).tolist()
    blocks = []
    for start, stop, p0, p1 in zip(starts[:-1], starts[1:], cuts[:-1], cuts[1:]):
        sent_K = sent_P[p0:p1]
        lo, hi = int(sent_K.min()), int(sent_K.max()) + 1
        counts = torch.sparse_coo_tensor(torch.stack([sent_K - lo, row_P[p0:p1] - start]), count_P[p0:p1],
                                         (hi - lo, stop - start), check_invariants=True).coalesce()
        blocks.append(_GramBlock(start, stop, lo, hi, counts))
    first_row_U = torch.full((U,), T, device=dev).scatter_reduce_(0, vec_T, torch.arange(T, device=dev), "amin")
    return first_row_U[order_U], blocks


def _vectors_and_sigma(token_vecs: torch.Tensor, device, sigma: float | None, median_pairs: int, seed: int,
                       convention: str) -> tuple[torch.Tensor, float]:
    """The token vectors in fp32 on the Gram's device, and the bandwidth: `sigma` checked, or the median heuristic."""
    dev = torch.device(device) if device is not None else token_vecs.device
    x_TD = token_vecs.to(dev, torch.float32)
    if sigma is None:
        sigma = median_sigma(x_TD, median_pairs=median_pairs, seed=seed, convention=convention)
    elif not sigma > 0:
        raise HybridlabError(f"sigma must be > 0, got {sigma}")
    return x_TD, sigma


def sentence_gram(token_vecs: torch.Tensor, offsets: torch.Tensor, sigma: float | None = None,
                  block_tokens: int = 1024, device: str | torch.device | None = None, *,
                  median_pairs: int = MEDIAN_PAIRS, seed: int = 0,
                  sigma_convention: str = "median_distance") -> tuple[torch.Tensor, float]:
    """Exact sentence Gram K[i, j] = mean RBF kernel over token pairs; returns (K [N, N] float64 CPU, sigma).

    sigma=None: the median heuristic under `sigma_convention` (module docstring)."""
    _check_offsets(token_vecs, offsets)
    if block_tokens < 1:
        raise HybridlabError(f"block_tokens must be >= 1, got {block_tokens}")
    x_TD, sigma = _vectors_and_sigma(token_vecs, device, sigma, median_pairs, seed, sigma_convention)
    dev = x_TD.device
    lengths_N = (offsets[1:] - offsets[:-1]).to(dev, torch.long)
    N = lengths_N.numel()
    row_R, blocks = _gram_layout(x_TD, lengths_N, block_tokens)
    # Centre (distances do not change; limits cancellation below) and scale so the kernel is exp(-||a'-b'||^2).
    xs_RD = ((x_TD - x_TD.mean(0, keepdim=True)) * (1.0 / (math.sqrt(2.0) * sigma))).index_select(0, row_R)
    sq_R1 = (xs_RD * xs_RD).sum(1, keepdim=True)
    ones_R1 = torch.ones_like(sq_R1)
    # Augmented rows l_a = log2(e) [2a, -|a|^2, -1] and r_b = [b, 1, |b|^2]: l_a . r_b = -log2(e) ||a - b||^2,
    # so ONE GEMM + exp2 gives each kernel block (exp2 is vectorised; torch's exp takes a slow path for
    # the large negative arguments that far tokens produce).
    left_RA = torch.cat([2.0 * xs_RD, -sq_R1, -ones_R1], 1).mul_(LOG2E)
    right_RA = torch.cat([xs_RD, ones_R1, sq_R1], 1)
    onednn = _onednn_gemm_available(dev)
    rights = [right_RA[b.start:b.stop].to_mkldnn() if onednn else right_RA[b.start:b.stop].T for b in blocks]
    sums_NN = torch.zeros(N, N, dtype=torch.float32, device=dev)
    for bi, blk_i in enumerate(blocks):
        left_i = left_RA[blk_i.start:blk_i.stop]
        for bj in range(bi, len(blocks)):
            blk_j = blocks[bj]
            if onednn:  # the clamp fused into the GEMM's epilogue (oneDNN's hardtanh post-op)
                e_ab = torch.ops.mkldnn._linear_pointwise(left_i, rights[bj], None, "hardtanh",
                                                          [MIN_LOG2_KERNEL, MAX_LOG2_KERNEL], "")
            else:
                e_ab = torch.mm(left_i, rights[bj]).clamp_(MIN_LOG2_KERNEL, MAX_LOG2_KERNEL)
            # blocks are sized to stay in cache, so the GEMM output is exponentiated and reduced while hot
            sums_mn = blk_j.sum_cols(blk_i.sum_rows(e_ab.exp2_()))
            sums_NN[blk_i.lo:blk_i.hi, blk_j.lo:blk_j.hi] += sums_mn
            if bj != bi:  # the lower block triangle is the transpose of the upper one
                sums_NN[blk_j.lo:blk_j.hi, blk_i.lo:blk_i.hi] += sums_mn.T
    sums_NN = sums_NN.double().cpu()
    lengths = lengths_N.cpu().to(torch.float64)
    # a diagonal block sums both orders of its pairs, in different float order: average the two
    K_NN = (sums_NN + sums_NN.T) * 0.5 / (lengths[:, None] * lengths[None, :])
    return K_NN, float(sigma)


def _rff_weights(D: int, half: int, seed: int, orthogonal: bool) -> torch.Tensor:
    """[D, half] frequencies for a unit bandwidth: i.i.d. N(0, I) columns, or orthogonal random features
    (Yu et al. 2016): blocks of D orthonormal directions, each rescaled by an independent chi_D norm,
    so every column is still marginally N(0, I) but the columns of a block are not independent."""
    gen = torch.Generator().manual_seed(seed)
    if not orthogonal:
        return torch.randn(D, half, generator=gen)
    blocks = []
    for _ in range(math.ceil(half / D)):
        q_DD, r_DD = torch.linalg.qr(torch.randn(D, D, generator=gen, dtype=torch.float64))
        q_DD = q_DD * torch.sign(torch.diagonal(r_DD))[None, :]  # Haar-distributed Q
        norms_D = torch.randn(D, D, generator=gen, dtype=torch.float64).norm(dim=0)
        blocks.append(q_DD * norms_D[None, :])
    return torch.cat(blocks, dim=1)[:, :half].float()


def rff_sentence_gram(token_vecs: torch.Tensor, offsets: torch.Tensor, n_features: int, seed: int,
                      sigma: float | None = None, device: str | torch.device | None = None, *,
                      orthogonal: bool = True, median_pairs: int = MEDIAN_PAIRS,
                      chunk_tokens: int = 8192, sigma_convention: str = "median_distance"
                      ) -> tuple[torch.Tensor, float]:
    """Random-Fourier-feature sentence Gram (n_features = 2 F', even); returns (K_rff [N, N] float64 CPU, sigma)."""
    _check_offsets(token_vecs, offsets)
    if n_features < 2 or n_features % 2:
        raise HybridlabError(f"n_features must be an even number >= 2 (cos and sin pairs), got {n_features}")
    x_TD, sigma = _vectors_and_sigma(token_vecs, device, sigma, median_pairs, seed, sigma_convention)
    dev = x_TD.device
    T, D = x_TD.shape
    half = n_features // 2
    w_DF = (_rff_weights(D, half, seed, orthogonal) / sigma).to(dev)
    x_TD = x_TD - x_TD.mean(0, keepdim=True)  # a shift only changes phases; keeps |W a| small for accuracy
    offsets = offsets.to(torch.long)
    lengths_N = (offsets[1:] - offsets[:-1]).to(dev)
    N = lengths_N.shape[0]
    seg_T = torch.repeat_interleave(torch.arange(N, device=dev), lengths_N)
    onednn = _onednn_gemm_available(dev)
    w_FD = w_DF.T.contiguous().to_mkldnn() if onednn else None
    # cos and sin features are summed per sentence into separate contiguous halves (no concatenated copy)
    cos_NF = torch.zeros(N, half, dtype=torch.float32, device=dev)
    sin_NF = torch.zeros(N, half, dtype=torch.float32, device=dev)
    for t0 in range(0, T, chunk_tokens):
        x_CD = x_TD[t0:t0 + chunk_tokens]
        if onednn:
            proj_CF = torch.ops.mkldnn._linear_pointwise(x_CD, w_FD, None, "none", [], "")
        else:
            proj_CF = x_CD @ w_DF
        seg_C = seg_T[t0:t0 + chunk_tokens]
        cos_NF.index_add_(0, seg_C, proj_CF.cos())
        sin_NF.index_add_(0, seg_C, proj_CF.sin_())
    scale_N1 = (1.0 / (lengths_N.to(torch.float32)[:, None] * math.sqrt(half)))
    phi_NF = torch.cat([cos_NF, sin_NF], dim=1).mul_(scale_N1)
    # fp32 product (the exact path's block sums are fp32 too); float64 from here on
    return (phi_NF @ phi_NF.T).double().cpu(), float(sigma)


def rff_error_bound(n_sentences: int, n_features: int, delta: float = 0.01) -> float:
    """Hoeffding + union bound: max |K_rff - K| <= this with probability >= 1 - delta."""
    return math.sqrt(2.0 * math.log(2.0 * n_sentences ** 2 / delta) / (n_features // 2))
