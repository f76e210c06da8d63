"""SoftCKA: cross-lingual similarity of token-set representations without token alignment.

Definitions (this project's; docs/methods.md, "SoftCKA and pair alignment"):

- A sentence is the *set* S_i of its token vectors (hidden states or `attn_delta` of one layer).
- Sentence kernel within one language: the mean RBF kernel over all token pairs (a set kernel, i.e. the
  inner product of kernel mean embeddings, "soft matching" of tokens),
      k(S_i, S_j) = mean_{a in S_i, b in S_j} exp(-||a - b||^2 / (2 sigma^2)).
- Bandwidth, median heuristic, over token pairs a != b (by position) of ONE language and layer,
  pooled over all its sentences, under an explicit `sigma_convention`:
    "median_distance" (default, the project's convention since the start): sigma = median ||a - b||;
    "median_sq_distance" (the other common one): 2 sigma^2 = median ||a - b||^2, i.e. the median
    distance / sqrt(2) (the median picks one element, so squaring commutes with it).
  The second halves sigma^2, so the kernel is sharper: measured on the project's models it moves SoftCKA
  by up to 0.027; on seeded toy sets (N = 64) by ~0.001 for related and +0.09 for unrelated sets. If the language has at most `median_pairs` distinct pairs all of them are used,
  otherwise all pairs among m tokens drawn uniformly without replacement with
  `torch.Generator().manual_seed(seed)`, m the smallest with m(m-1)/2 >= median_pairs. The tokens
  depend only on the token count and the seed, so rotating or scaling the vectors leaves the chosen
  pairs, and hence SoftCKA, unchanged.
- SoftCKA (linear CKA of Kornblith et al. 2019, "Similarity of Neural Network Representations
  Revisited", applied to the two N x N sentence Gram matrices K (English) and L (language X)):
      SoftCKA = HSIC(K, L) / sqrt(HSIC(K, K) HSIC(L, L)),  HSIC(K, L) = tr(K H L H), H = I - 11^T / N.
  With Kc = H K H (computed once per Gram) HSIC(K, L) = <Kc, Lc>_F, so the (N-1)^-2 factors cancel.
  This plain (biased) estimator is positive even for unrelated data at small N (the diagonal of both
  Grams is large; independent random sets give ~0.1 at N = 64); `cka_debiased` reports CKA with the
  unbiased HSIC estimator of Song et al. (2012), which is ~0 for unrelated data. Both are reported.
- Pair alignment (default `alignment="kme"`, the design's definition): per translation pair i, the
  centred cosine of the kernel mean embeddings of S_i^EN and S_i^X in the model's ONE representation
  space. The 2N sets of both languages are pooled (S_1..S_N English, S_{N+1}..S_{2N} language X) with
  ONE bandwidth sigma_pair (the same median heuristic and convention over the pooled tokens of both
  languages), G[p, q] = k(S_p, S_q) is their 2N x 2N set-kernel Gram (the off-diagonal blocks are the
  cross-language kernel k(S_i^EN, S_j^X)), and the centring subtracts the mean embedding of all 2N sets:
      G~[p, q] = G[p, q] - mean_r G[p, r] - mean_r G[r, q] + mean_{r, s} G[r, s]   (r, s over the 2N sets)
               = (H G H)[p, q],  H = I - 11^T / (2N),
      alignment_i = G~[i, N+i] / sqrt(G~[i, i] G~[N+i, N+i]),
  and the corpus value is the mean over i. Identical inputs -> 1; unrelated sets -> ~0.
- Variant `alignment="gram_rows"` (the project's earlier, relational measure, kept as
  `alignment_gram_rows` in every result): the cosine between row i of Kc and row i of Lc with the
  diagonal entry j = i left out. It asks "is sentence i similar to the same OTHER sentences in both
  languages", needs no shared space (so it also compares different models and tokenisers) and no extra
  Gram, but it is a different quantity: it measures the shape of the similarity structure, not whether
  the two sentences of a pair sit together. Seeded toy corpora (N = 64, tests' `_structured_sets`):
  language X = English re-tokenised gives 0.98 with both; re-tokenised AND rotated (same structure,
  another space) gives gram_rows 0.98 but kme -0.10 to -0.14; unrelated sets give ~0 with both.

Exact path. Each distinct token vector is one row of the layout: a causal model gives sentences that
start with the same tokens bit-identical states there, and layer 0 is one embedding row per token id
(in the benchmark's 1,000 English sentences 81 % of the rows are distinct at layers 1-12, 4 % at
layer 0). Rows are cut into blocks of `block_tokens`; each block has a sparse [sentences, rows] count
matrix (how often each vector occurs in each sentence), so a block's kernel terms are summed per
sentence pair by two sparse products. Vectors private to one sentence come first in token order (a
block then covers a few consecutive sentences), vectors found in >= 2 sentences ("shared") follow.
The sums hold the same terms as over all token pairs, added in another order, and the work shrinks by
the square of the distinct fraction (0.66 above). For each pair of blocks (upper block triangle only)
ONE fp32 GEMM of augmented rows l_a = log2(e) [2a, -|a|^2, -1] and r_b = [b, 1, |b|^2] gives
-log2(e) ||a - b||^2 for every row pair and exp2 turns it into the kernel block (no padding: a
sentence may straddle two blocks). Blocks of ~1,000 rows keep the GEMM output in cache
while it is exponentiated and reduced. Vectors are mean-centred first (distances do not change) to
limit cancellation in the expansion: the exponent's absolute error is ~1e-7 (|a'|^2 + |b'|^2) in
bandwidth units, negligible unless two near-identical tokens lie hundreds of sigmas from the mean
(massive activations; special tokens are dropped by the capture anyway).
Why these choices, measured on this project's 2-core AMD CPU (single thread): torch's `exp` is 2-3x
slower than `exp2` on ordinary arguments and ~100x slower on the large negative ones far tokens produce
(denormal or zero results); on an Intel Xeon `exp2` itself is 3-8x slower where its results are denormal,
so its argument is clamped at -126 (`MIN_LOG2_KERNEL`); MKL's fp32 GEMM, which `torch.mm` uses, ran ~2x slower than oneDNN's
(AVX-512 on every vendor), so on CPU the blocks go through oneDNN (`torch.ops.mkldnn._linear_pointwise`,
same fp32 math, bit-identical results here) and through `torch.mm` only where oneDNN is absent
(`_onednn_gemm_available`); the GEMM is ~70 % of the time. Runs on any torch device (`device="cuda"` on
a GPU). Cost ~ U^2 (D + 2) / 2 fp32 multiply-adds per language (U rows after deduplication, at most
the T tokens); `benchmarks/softcka.py` compares it with the model's forward pass.
The RFF path costs ~ T D F (one GEMM, F cos/sin per token) plus the shared median heuristic.

Approximate path (random Fourier features, Rahimi & Recht 2007): phi(a) = F'^-1/2 [cos(W a), sin(W a)]
with columns w_f ~ N(0, sigma^-2 I), F = 2 F' features, so phi(a).phi(b) = mean_f cos(w_f.(a - b)) is an
unbiased estimate of the RBF kernel bounded in [-1, 1]; the kernel mean embedding of a sentence is the
mean of phi over its tokens and K_rff = Phi Phi^T. With i.i.d. w_f each entry is a mean of F' i.i.d.
terms in [-1, 1], so by Hoeffding and a union bound over the N^2 entries,
max |K_rff - K| <= sqrt(2 ln(2 N^2 / delta) / F') with probability >= 1 - delta (`rff_error_bound`).
The default draws orthogonal random features (Yu et al. 2016), which are still unbiased and have
lower variance for the RBF kernel (measured here: 2-4x smaller max error and a less biased CKA); the
bound is proven for i.i.d. features only and is checked empirically for both in the tests. Both
languages use the same seed, so identical inputs give SoftCKA = 1 exactly on this path too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np
import torch

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError

if TYPE_CHECKING:
    import polars as pl

TokenSets = Sequence[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]

MEDIAN_PAIRS = 100_000
SIGMA_CONVENTIONS = ("median_distance", "median_sq_distance")
ALIGNMENTS = ("kme", "gram_rows")


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
        # exact pdist instead of gathering `median_pairs` random row pairs (~25x faster, same estimator
        # up to the dependence between pairs that share a token)
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
# counts as 2^-126, an absolute change below 1.2e-38 per token pair. Results under 2^-126 are denormal, and on
# Intel CPUs each one costs a microcode assist: blocks with many far tokens ran 3-8x slower in exp2
# (docs/performance.md, "Denormal kernel values"). The upper clamp only keeps the post-op's range finite.
MIN_LOG2_KERNEL, MAX_LOG2_KERNEL = -126.0, 126.0


def _onednn_gemm_available(dev: torch.device) -> bool:
    """Whether the CPU GEMMs of the Gram paths go through oneDNN (AVX-512 kernels on every x86 vendor;
    MKL's sgemm behind torch.mm measured ~2x slower on this project's AMD CPU). Same fp32 math."""
    return (dev.type == "cpu" and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _distinct_rows(x_TD: torch.Tensor) -> torch.Tensor:
    """vec_T [T]: an id per distinct row (bit-identical rows share one, ids 0..U-1 in order of first row).

    Rows are grouped by a float64 random projection (one GEMV + a 1-D sort, ~10x faster than the
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
        return torch.sparse.mm(self.counts, r_AR.T.contiguous()).T  # 2-9x faster than on the strided view


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


def sentence_gram(token_vecs: torch.Tensor, offsets: torch.Tensor, sigma: float | None = None,
                  block_tokens: int = 1024, device: str | torch.device | None = None, *,
                  median_pairs: int = MEDIAN_PAIRS, seed: int = 0,
                  sigma_convention: str = "median_distance") -> tuple[torch.Tensor, float]:
    """Exact sentence Gram K[i, j] = mean RBF kernel over token pairs; returns (K [N, N] float64 CPU, sigma).

    sigma=None: the median heuristic under `sigma_convention` (module docstring)."""
    _check_offsets(token_vecs, offsets)
    if block_tokens < 1:
        raise HybridlabError(f"block_tokens must be >= 1, got {block_tokens}")
    dev = torch.device(device) if device is not None else token_vecs.device
    x_TD = token_vecs.to(dev, torch.float32)
    if sigma is None:
        sigma = median_sigma(x_TD, median_pairs=median_pairs, seed=seed, convention=sigma_convention)
    elif not sigma > 0:
        raise HybridlabError(f"sigma must be > 0, got {sigma}")
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
    dev = torch.device(device) if device is not None else token_vecs.device
    x_TD = token_vecs.to(dev, torch.float32)
    if sigma is None:
        sigma = median_sigma(x_TD, median_pairs=median_pairs, seed=seed, convention=sigma_convention)
    elif not sigma > 0:
        raise HybridlabError(f"sigma must be > 0, got {sigma}")
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


def center_gram(K_NN: torch.Tensor) -> torch.Tensor:
    """H K H with H = I - 11^T/N, in float64 (double centring of rows and columns)."""
    K = K_NN.double()
    row_N1 = K.mean(1, keepdim=True)
    col_1N = K.mean(0, keepdim=True)
    return K - row_N1 - col_1N + K.mean()


def _check_pair(K: torch.Tensor, L: torch.Tensor) -> None:
    if K.dim() != 2 or K.shape[0] != K.shape[1] or K.shape != L.shape:
        raise HybridlabError(f"Gram matrices must be square and of equal size, got {tuple(K.shape)} and "
                             f"{tuple(L.shape)}; both languages need the same parallel sentences")
    if K.shape[0] < 4:
        raise HybridlabError(f"CKA needs at least 4 sentences, got {K.shape[0]}")


def _hsic_unbiased(K: torch.Tensor, L: torch.Tensor) -> float:
    """Unbiased HSIC estimator of Song et al. (2012) on diagonal-free Gram matrices (needs N >= 4)."""
    n = K.shape[0]
    Kt, Lt = K.double().clone(), L.double().clone()
    Kt.fill_diagonal_(0.0)
    Lt.fill_diagonal_(0.0)
    k1_N, l1_N = Kt.sum(1), Lt.sum(1)
    value = ((Kt * Lt).sum() + k1_N.sum() * l1_N.sum() / ((n - 1) * (n - 2))
             - 2.0 / (n - 2) * (k1_N * l1_N).sum())
    return float(value) / (n * (n - 3))


def cka_from_grams(K: torch.Tensor, L: torch.Tensor, *, centered: bool = False, debiased: bool = False) -> float:
    """Linear CKA <Kc, Lc> / (||Kc|| ||Lc||); centered=True when both are already H K H.

    debiased=True uses the unbiased HSIC estimator instead (Song et al. 2012; "debiased CKA"), whose
    value for unrelated representations is ~0 instead of the positive small-N bias of the plain form.
    It needs the raw (uncentred) Gram matrices and N >= 4.
    """
    _check_pair(K, L)
    if debiased:
        if centered:
            raise HybridlabError("debiased CKA needs the raw Gram matrices; pass centered=False")
        kk, ll = _hsic_unbiased(K, K), _hsic_unbiased(L, L)
        if not (kk > 0 and ll > 0):
            raise HybridlabError("unbiased HSIC(K, K) is not positive (too few or identical sentences); "
                                 "use more sentences or the plain CKA")
        return _hsic_unbiased(K, L) / math.sqrt(kk * ll)
    Kc = K.double() if centered else center_gram(K)
    Lc = L.double() if centered else center_gram(L)
    denom = float(Kc.norm() * Lc.norm())
    if denom == 0.0:
        raise HybridlabError("a centred Gram matrix is all zeros (every sentence has the same "
                             "representation); CKA is undefined for this layer")
    return float((Kc * Lc).sum()) / denom


def pair_alignment(pooled_gram: torch.Tensor, *, centered: bool = False) -> torch.Tensor:
    """The defined pair alignment, per translation pair i ([N]), from the pooled 2N x 2N set-kernel Gram
    (rows/columns 0..N-1 English, N..2N-1 language X, one bandwidth): centre over the 2N sets
    (G~ = H G H), then cos_i = G~[i, N+i] / sqrt(G~[i, i] G~[N+i, N+i]). See the module docstring."""
    G = pooled_gram
    if G.dim() != 2 or G.shape[0] != G.shape[1] or G.shape[0] % 2 or G.shape[0] < 4:
        raise HybridlabError(f"the pooled Gram must be square with 2N >= 4 rows (N English then N language-X "
                             f"sentences), got shape {tuple(G.shape)}; build it from both languages' sets")
    Gc = G.double() if centered else center_gram(G)
    n = G.shape[0] // 2
    idx = torch.arange(n)
    num_N = Gc[idx, idx + n]
    den_N = (Gc[idx, idx].clamp_min(0.0) * Gc[idx + n, idx + n].clamp_min(0.0)).sqrt()
    return num_N / den_N.clamp_min(torch.finfo(torch.float64).tiny)


def pair_alignment_gram_rows(K: torch.Tensor, L: torch.Tensor, *, centered: bool = False) -> torch.Tensor:
    """Variant "gram_rows": per pair i, cosine of centred Gram rows K_i and L_i without the diagonal; [N].

    Relational (needs no shared space), but not the defined alignment; see the module docstring."""
    _check_pair(K, L)
    Kc = (K.double() if centered else center_gram(K)).clone()
    Lc = (L.double() if centered else center_gram(L)).clone()
    Kc.fill_diagonal_(0.0)
    Lc.fill_diagonal_(0.0)
    num_N = (Kc * Lc).sum(1)
    den_N = Kc.norm(dim=1) * Lc.norm(dim=1)
    return num_N / den_N.clamp_min(torch.finfo(torch.float64).tiny)


@dataclass(frozen=True)
class SoftCkaResult:
    """SoftCKA and pair alignment of one (layer, representation, language) against English."""

    cka: float  # linear CKA of the centred sentence Gram matrices (the headline value)
    cka_debiased: float  # the same with the unbiased HSIC estimator (~0 for unrelated data)
    alignment: float  # mean over translation pairs of the `alignment_method` alignment
    alignment_gram_rows: float  # mean over pairs of `pair_alignment_gram_rows` (always computed; free)
    alignment_method: str  # "kme" (the defined `pair_alignment`) or "gram_rows"
    sigma_eng: float
    sigma_x: float
    sigma_pair: float | None  # the pooled bandwidth of the kme alignment (None for gram_rows)
    sigma_convention: str
    n_sentences: int
    method: str  # "exact" or "rff"
    # percentile bootstrap over sentences (n_boot > 0; NaN otherwise): plain CKA recomputed from the rows and
    # columns of both Grams at the resampled sentences; alignment = mean of the per-pair values resampled
    cka_lo: float = math.nan
    cka_hi: float = math.nan
    alignment_lo: float = math.nan
    alignment_hi: float = math.nan


def cka_bootstrap(K: torch.Tensor, L: torch.Tensor, n_boot: int, seed: int = 0, level: float = 0.95):
    """Percentile bootstrap CI of the plain CKA over sentences: replicate b recomputes CKA from
    K[I_b, I_b] and L[I_b, I_b] (re-centred), the same sentence indices I_b for both Grams
    (`stats.bootstrap_ci_indices`; a sentence drawn twice appears twice)."""
    from hybridlab.eval.stats import bootstrap_ci_indices

    Kn, Ln = K.double().cpu().numpy(), L.double().cpu().numpy()
    n = Kn.shape[0]
    KL, KK, LL = Kn * Ln, Kn * Kn, Ln * Ln

    def cka_of(idx_BN: np.ndarray) -> np.ndarray:
        """CKA of every replicate of a (B, N) batch of index sets, from sentence weights p = counts / N: the
        resampled Grams' centred inner product is sum_ab p_a p_b Kc_ab Lc_ab = p'(K o L)p - 2 p.(Kp o Lp)
        + (p'Kp)(p'Lp) (weighted centring), so a batch costs a few [B, N] x [N, N] products."""
        B = idx_BN.shape[0]
        p = np.bincount((idx_BN + n * np.arange(B)[:, None]).ravel(), minlength=B * n).reshape(B, n) / n
        kp, lp = p @ Kn, p @ Ln  # K and L are symmetric

        def centred(M, a, b):  # M = A o B, a = pA, b = pB
            return ((p @ M) * p).sum(1) - 2.0 * (p * a * b).sum(1) + (a * p).sum(1) * (b * p).sum(1)

        num, kk, ll = centred(KL, kp, lp), centred(KK, kp, kp), centred(LL, lp, lp)
        den = np.sqrt(np.clip(kk, 0.0, None) * np.clip(ll, 0.0, None))
        return np.divide(num, den, out=np.full_like(num, np.nan), where=den > 0)

    return bootstrap_ci_indices(n, cka_of, n_boot=n_boot, level=level, seed=seed, batched=True)


def soft_cka(eng_sets: TokenSets, x_sets: TokenSets, *, method: str = "exact",
             eng_gram: tuple[torch.Tensor, float] | None = None, block_tokens: int = 1024,
             device: str | torch.device | None = None, n_features: int = 2048, seed: int = 0,
             orthogonal: bool = True, median_pairs: int = MEDIAN_PAIRS,
             sigma_convention: str = "median_distance", alignment: str = "kme", n_boot: int = 0) -> SoftCkaResult:
    """SoftCKA between English and language X token sets (same sentence order, any token counts).

    `n_boot` > 0 adds percentile bootstrap CIs over sentences (`cka_lo/hi` by `cka_bootstrap`,
    `alignment_lo/hi` over the per-pair alignments), replicates drawn from `seed`.

    `eng_gram` = a (K, sigma) pair from `sentence_gram`/`rff_sentence_gram` (same method and
    sigma_convention) to reuse the English Gram across languages. With alignment="kme" the English sets
    are still needed (the pooled Gram of both languages); with "gram_rows" `eng_sets` may then be empty.
    """
    if method not in ("exact", "rff"):
        raise HybridlabError(f"unknown SoftCKA method {method!r}; use 'exact' or 'rff'")
    check_sigma_convention(sigma_convention)
    if alignment not in ALIGNMENTS:
        raise HybridlabError(f"unknown pair alignment {alignment!r}; use 'kme' (the defined centred cosine of "
                             "kernel mean embeddings) or 'gram_rows' (cosine of centred Gram rows)")

    def gram(sets: TokenSets) -> tuple[torch.Tensor, float]:
        flat, off = flatten_sets(sets)
        if method == "exact":
            return sentence_gram(flat, off, None, block_tokens, device, median_pairs=median_pairs, seed=seed,
                                 sigma_convention=sigma_convention)
        return rff_sentence_gram(flat, off, n_features, seed, device=device, orthogonal=orthogonal,
                                 median_pairs=median_pairs, sigma_convention=sigma_convention)

    x_flat, x_off = flatten_sets(x_sets)
    n_x = x_off.numel() - 1
    if eng_gram is None:
        K, sigma_e = gram(eng_sets)
    else:
        K, sigma_e = eng_gram
    if K.shape[0] != n_x:
        raise HybridlabError(f"English has {K.shape[0]} sentences but language X has {n_x}; SoftCKA needs "
                             "the same parallel sentences (same sids, same order) in both")
    L, sigma_x = gram((x_flat, x_off))
    Kc, Lc = center_gram(K), center_gram(L)
    rows = float(pair_alignment_gram_rows(Kc, Lc, centered=True).mean())
    sigma_pair = None
    if alignment == "kme":
        if isinstance(eng_sets, (list, tuple)) and len(eng_sets) == 0:
            raise HybridlabError("the kme pair alignment needs the English token sets (a pooled Gram of both "
                                 "languages); pass them with eng_gram, or use alignment='gram_rows'")
        e_flat, e_off = flatten_sets(eng_sets)
        if e_off.numel() - 1 != n_x:
            raise HybridlabError(f"English has {e_off.numel() - 1} token sets but language X has {n_x}; pass "
                                 "the same parallel sentences in both")
        pooled_flat = torch.cat([e_flat.to(x_flat.device, torch.float32), x_flat.float()])
        pooled_off = torch.cat([e_off, e_off[-1] + x_off[1:]])
        G, sigma_pair = gram((pooled_flat, pooled_off))
        per_pair = pair_alignment(G)
    else:
        per_pair = pair_alignment_gram_rows(Kc, Lc, centered=True)
    value = float(per_pair.mean()) if alignment == "kme" else rows
    ci = {}
    if n_boot and n_x >= 2:
        from hybridlab.eval.stats import bootstrap_ci

        c = cka_bootstrap(K, L, n_boot, seed)
        a = bootstrap_ci(per_pair.double().cpu().numpy(), n_boot=n_boot, seed=seed)
        ci = {"cka_lo": c.lo, "cka_hi": c.hi, "alignment_lo": a.lo, "alignment_hi": a.hi}
    return SoftCkaResult(**ci, cka=cka_from_grams(Kc, Lc, centered=True),
                         cka_debiased=cka_from_grams(K, L, debiased=True),
                         alignment=value, alignment_gram_rows=rows, alignment_method=alignment,
                         sigma_eng=sigma_e, sigma_x=sigma_x, sigma_pair=sigma_pair,
                         sigma_convention=sigma_convention, n_sentences=n_x, method=method)


# --- the SoftCKA table of the eval_softcka rule ----------------------------------------------------------

SOFTCKA_TABLE_SORT = ("model", "pair", "kind", "layer", "lang")


def layer_groups(n_layers: int, per_pass: int) -> list[list[int]]:
    """Hidden-state indices 0..L in passes of `per_pass` (0 = all in one pass); attn_delta uses the same
    indices below L, so each pass captures <= 2 * per_pass token matrices per language."""
    idx = list(range(n_layers + 1))
    size = per_pass if per_pass > 0 else len(idx)
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def softcka_table(parallel: "pl.DataFrame", params: dict, *, device: str | None = None,
                  log: Callable[[str], None] = print) -> "pl.DataFrame":
    """The SoftCKA table of every analysis model: cross-lingual similarity of every layer, English vs each
    parallel language (the eval_softcka rule; workflow_scripts/eval_softcka.py).

    `parallel`: the corpus table (sid, lang, text, source). `params`: `models` (the keyword arguments of
    `hybridlab.eval.pairs.analysis_models`), `dtype`, `seed`, `english` and `softcka` = {n_sentences, kinds
    (hidden / attn_delta), method (exact | rff), block_tokens, rff_features, batch_size, layers_per_pass
    (0 = all in one pass), optional languages (default: every language of the corpus), sigma_convention
    (median_distance | median_sq_distance, default median_distance), alignment (kme | gram_rows, default
    kme), n_boot (default 0)}. `device`: default `hybridlab.device.resolve_device()`. Progress goes to `log`.

    The same N parallel sentences (`pairs.parallel_sample`: a seeded sample of sids present in English and
    every analysed language) are run through each model (loaded once) per language; for each kind and
    layer, SoftCKA, its debiased variant and the mean per-pair alignment are computed between English and
    language X (`soft_cka`; the English Gram is computed once per layer and shared by all languages, the
    kme alignment needs one pooled Gram of both languages per language).

    One row per (model, pair, kind, layer, lang), sorted so:
      model, pair, role (hybrid | dense) - the analysed model and each pair it belongs to (rows repeat per pair)
      kind       - `hidden` (residual stream) or `attn_delta` (the token mixer's residual contribution)
      layer      - hidden: hidden-state index 0..L (0 = embeddings, l = after decoder layer l-1, L is taken
                   after the final norm as in transformers); attn_delta: decoder layer 0..L-1
      layer_type - `embedding` for hidden 0, else the decoder layer's type (`full_attention` or mixer kind)
      lang       - language X (English is the reference and has no row)
      cka        - plain (biased) linear CKA of the sentence Grams; biased upward at small N
      cka_debiased - the same with the unbiased HSIC estimator (~0 for unrelated representations)
      alignment  - mean per-pair alignment of `alignment_method` (kme: the defined centred cosine of kernel
                   mean embeddings in one space; gram_rows: cosine of centred Gram rows)
      alignment_gram_rows - the gram_rows variant (always reported)
      cka_lo, cka_hi, alignment_lo, alignment_hi - 95 % percentile bootstrap over the N sentences
                   (`n_boot` replicates, seed `seed`; NaN with n_boot 0): CKA recomputed from both Grams'
                   rows and columns at the resampled sentences; the mean of the resampled per-pair alignments
      n_sentences, method (exact | rff), sigma_eng, sigma_x (RBF bandwidths), sigma_pair (the pooled
      bandwidth of the kme alignment; null for gram_rows), sigma_convention
    """
    import time

    import polars as pl

    from hybridlab.eval import pairs
    from hybridlab.eval.capture import capture_hidden_states

    cfg = params["softcka"]
    english, seed = params["english"], params["seed"]
    texts = pairs.parallel_sample(parallel, english, cfg.get("languages"), cfg["n_sentences"], seed)
    langs = [lang for lang in texts if lang != english]
    kinds = cfg["kinds"]
    device = resolve_device(device)
    method = cfg["method"]
    convention = cfg.get("sigma_convention", "median_distance")
    alignment = cfg.get("alignment", "kme")
    log(f"softcka: {len(texts[english])} sentences, English vs {langs}, kinds {kinds}, method {method}, "
        f"device {device}, sigma {convention}, alignment {alignment}")

    def gram(flat, off):
        if method == "exact":
            return sentence_gram(flat, off, block_tokens=cfg["block_tokens"], device=device, seed=seed,
                                 sigma_convention=convention)
        return rff_sentence_gram(flat, off, cfg["rff_features"], seed, device=device, sigma_convention=convention)

    rows = []
    for m in pairs.analysis_models(**params["models"]):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=params["dtype"], device=device)
        types = pairs.layer_types(model)
        n_layers = len(types)
        for group in layer_groups(n_layers, cfg["layers_per_pass"]):
            delta = [layer for layer in group if layer < n_layers] if "attn_delta" in kinds else []
            hidden = group if "hidden" in kinds else []

            def capture(lang):
                return capture_hidden_states(model, tok, texts[lang], layers=hidden, delta_layers=delta,
                                             with_attn_delta=bool(delta), batch_size=cfg["batch_size"])

            units = [("hidden", layer) for layer in hidden] + [("attn_delta", layer) for layer in delta]
            if not units:  # e.g. only attn_delta asked and this pass holds just the final hidden state
                continue
            eng = capture(english)
            # the English token sets are kept for the pooled Gram of the kme alignment
            eng_sets = {u: eng.flat(*u) for u in units} if alignment == "kme" else {u: () for u in units}
            eng_grams = {u: gram(*eng.flat(*u)) for u in units}
            del eng
            for lang in langs:
                cap = capture(lang)
                for kind, layer in units:
                    # English enters through its precomputed Gram, so no English token sets are passed
                    res = soft_cka(eng_sets[(kind, layer)], cap.flat(kind, layer), method=method,
                                   eng_gram=eng_grams[(kind, layer)], block_tokens=cfg["block_tokens"], device=device,
                                   n_features=cfg["rff_features"], seed=seed, sigma_convention=convention,
                                   alignment=alignment, n_boot=cfg.get("n_boot", 0))
                    if kind == "hidden":
                        ltype = "embedding" if layer == 0 else types[layer - 1]
                    else:
                        ltype = types[layer]
                    for key in pairs.pair_rows(m):
                        rows.append(key | {"kind": kind, "layer": layer, "layer_type": ltype, "lang": lang,
                                           "cka": res.cka, "cka_lo": res.cka_lo, "cka_hi": res.cka_hi,
                                           "cka_debiased": res.cka_debiased, "alignment": res.alignment,
                                           "alignment_lo": res.alignment_lo, "alignment_hi": res.alignment_hi,
                                           "alignment_method": res.alignment_method,
                                           "alignment_gram_rows": res.alignment_gram_rows,
                                           "n_sentences": res.n_sentences, "method": res.method,
                                           "sigma_eng": res.sigma_eng, "sigma_x": res.sigma_x,
                                           "sigma_pair": res.sigma_pair, "sigma_convention": res.sigma_convention})
        del model
        log(f"  {m.name}: {n_layers} layers, {time.perf_counter() - t0:.1f}s")

    table = pl.DataFrame(rows, schema_overrides={"sigma_pair": pl.Float64}).sort(*SOFTCKA_TABLE_SORT)
    log(str(table.group_by("model", "kind").agg(pl.col("cka").mean()).sort("model", "kind")))
    return table
