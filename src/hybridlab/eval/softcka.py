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
- Pair alignment (default `alignment="kme"`, the headline): per translation pair i, the centred cosine of
  the kernel mean embeddings of S_i^EN and S_i^X in the model's ONE representation space, each language's
  own mean embedding removed. The 2N sets of both languages are pooled (S_1..S_N English, S_{N+1}..S_{2N}
  language X) with ONE bandwidth sigma_pair (the same median heuristic and convention over the pooled
  tokens of both languages); G[p, q] = k(S_p, S_q) is their 2N x 2N set-kernel Gram. With l(p) the
  language of set p and m_E, m_X the two languages' mean embeddings, the within-language centring is
      G~[p, q] = <mu_p - m_l(p), mu_q - m_l(q)>
               = G[p, q] - mean_{r in l(q)} G[p, r] - mean_{r in l(p)} G[r, q] + mean_{r in l(p), s in l(q)} G[r, s],
      alignment_i = G~[i, N+i] / sqrt(G~[i, i] G~[N+i, N+i]),
  and the corpus value is the mean over i. Identical inputs -> 1; unrelated sets -> ~0; adding one vector
  to every embedding of one language (an offset between the languages in the kernel's feature space)
  leaves it unchanged. A translation of one language's TOKEN vectors is not such an offset for the RBF
  kernel (phi(a + c) is not phi(a) + const), so it changes the value too, but far less than the pooled form.
- Language offset (`language_offset`): how far apart the two languages' mean embeddings lie relative to the
  spread of sentences around them, from the same pooled Gram:
      MMD^2 = ||m_E - m_X||^2 = mean G_EE + mean G_XX - 2 mean G_EX   (blocks of G)
      s_L^2 = mean_i ||mu_i - m_L||^2 = mean diag G_LL - mean G_LL      (per language)
      language_offset = sqrt(MMD^2 / ((s_E^2 + s_X^2) / 2)).
  0 for identical inputs; it grows as one language's embeddings move away from the other's. `mmd` keeps
  the unnormalised distance.
- Pooled pair alignment (`alignment_pooled`, the project's earlier headline, kept as a third column): the
  same cosine with ONE centring over all 2N sets (G~ = H G H, H = I - 11^T / (2N)). It leaves each
  language's mean embedding in the vectors, so the language offset dominates it: the more a model
  separates the two languages, the more negative it gets, whatever happens to the translation pairs.
- Variant `alignment="gram_rows"` (the project's earlier, relational measure, kept as
  `alignment_gram_rows` in every result): the cosine between row i of Kc and row i of Lc with the
  diagonal entry j = i left out. It asks "is sentence i similar to the same OTHER sentences in both
  languages", needs no shared space (so it also compares different models and tokenisers) and no extra
  Gram, but it is a different quantity: it measures the shape of the similarity structure, not whether
  the two sentences of a pair sit together. Seeded toy corpora (N = 64, tests' `_structured_sets`):
  language X = English re-tokenised gives 0.98 with both; re-tokenised AND rotated (same structure,
  another space) gives gram_rows 0.98 but kme -0.12 to -0.02; unrelated sets give ~0 with both.

The sentence Gram matrices (set kernel, bandwidth, exact and random-feature paths) are in
`hybridlab.eval.softcka_gram`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError
from hybridlab.eval.softcka_gram import (  # noqa: F401  (public names of the SoftCKA API)
    MEDIAN_PAIRS,
    SIGMA_CONVENTIONS,
    TokenSets,
    check_sigma_convention,
    flatten_sets,
    median_sigma,
    rff_error_bound,
    rff_sentence_gram,
    sentence_gram,
)

if TYPE_CHECKING:
    import polars as pl

ALIGNMENTS = ("kme", "gram_rows")


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


def _resample_weights(idx_BN: np.ndarray, n: int) -> np.ndarray:
    """(B, n) sentence weights of B bootstrap index sets: how often each sentence was drawn, over n."""
    B = idx_BN.shape[0]
    return np.bincount((idx_BN + n * np.arange(B)[:, None]).ravel(), minlength=B * n).reshape(B, n) / n


def _check_pooled(G: torch.Tensor) -> int:
    if G.dim() != 2 or G.shape[0] != G.shape[1] or G.shape[0] % 2 or G.shape[0] < 4:
        raise HybridlabError(f"the pooled Gram must be square with 2N >= 4 rows (N English then N language-X "
                             f"sentences), got shape {tuple(G.shape)}; build it from both languages' sets")
    return G.shape[0] // 2


def _cosines(num_N: torch.Tensor, a_N: torch.Tensor, b_N: torch.Tensor) -> torch.Tensor:
    den_N = (a_N.clamp_min(0.0) * b_N.clamp_min(0.0)).sqrt()
    return num_N / den_N.clamp_min(torch.finfo(torch.float64).tiny)


def pair_alignment(pooled_gram: torch.Tensor) -> torch.Tensor:
    """The pair alignment per translation pair i ([N]) from the pooled 2N x 2N set-kernel Gram (rows/columns
    0..N-1 English, N..2N-1 language X, one bandwidth): each language's own mean embedding removed, then
    cos_i = G~[i, N+i] / sqrt(G~[i, i] G~[N+i, N+i]). See the module docstring."""
    n = _check_pooled(pooled_gram)
    G = pooled_gram.double()
    to_e_P, to_x_P = G[:, :n].mean(1), G[:, n:].mean(1)  # mean kernel of each set to each language's sets
    g_ee, g_xx, g_ex = G[:n, :n].mean(), G[n:, n:].mean(), G[:n, n:].mean()
    idx = torch.arange(n)
    ee_N = G[idx, idx] - 2.0 * to_e_P[:n] + g_ee
    xx_N = G[idx + n, idx + n] - 2.0 * to_x_P[n:] + g_xx
    ex_N = G[idx, idx + n] - to_x_P[:n] - to_e_P[n:] + g_ex
    return _cosines(ex_N, ee_N, xx_N)


def pooled_pair_alignment(pooled_gram: torch.Tensor) -> torch.Tensor:
    """The pooled-centring variant per pair ([N]): ONE centring over all 2N sets (G~ = H G H), then the same
    cosine. It keeps the language offset in the vectors (module docstring); reported as `alignment_pooled`."""
    n = _check_pooled(pooled_gram)
    Gc = center_gram(pooled_gram)
    idx = torch.arange(n)
    return _cosines(Gc[idx, idx + n], Gc[idx, idx], Gc[idx + n, idx + n])


@dataclass(frozen=True)
class LanguageOffset:
    """Distance between the two languages' mean embeddings (`mmd`) and that distance relative to the RMS
    distance of a sentence's embedding from its own language's mean (`offset`)."""

    offset: float
    mmd: float


def _offsets(G: np.ndarray, p_BN: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offset, MMD^2) per row of sentence weights p_BN (each row sums to 1; one pair = one weight, the same
    for both languages) from the pooled Gram's blocks."""
    n = G.shape[0] // 2
    ee, xx, ex = G[:n, :n], G[n:, n:], G[:n, n:]

    def quad(M):
        return ((p_BN @ M) * p_BN).sum(1)

    q_ee, q_xx = quad(ee), quad(xx)
    mmd2 = q_ee + q_xx - 2.0 * quad(ex)
    spread = np.clip((p_BN @ np.diag(ee) - q_ee + p_BN @ np.diag(xx) - q_xx) / 2.0, 0.0, None)
    ratio = np.divide(np.clip(mmd2, 0.0, None), spread, out=np.full_like(spread, np.nan), where=spread > 0)
    return np.sqrt(ratio), mmd2


def language_offset(pooled_gram: torch.Tensor) -> LanguageOffset:
    """The language offset of the pooled 2N x 2N set-kernel Gram (module docstring): MMD between the two
    languages' kernel mean embeddings over the within-language spread."""
    n = _check_pooled(pooled_gram)
    offset, mmd2 = _offsets(pooled_gram.double().cpu().numpy(), np.full((1, n), 1.0 / n))
    return LanguageOffset(offset=float(offset[0]), mmd=math.sqrt(max(float(mmd2[0]), 0.0)))


def offset_bootstrap(pooled_gram: torch.Tensor, n_boot: int, seed: int = 0, level: float = 0.95):
    """Percentile bootstrap CI of `language_offset` over translation pairs: a replicate resamples the pairs
    (the same index for both languages) and recomputes the offset from the Gram's blocks with the resampled
    weights (`stats.bootstrap_ci_indices`)."""
    from hybridlab.eval.stats import bootstrap_ci_indices

    n = _check_pooled(pooled_gram)
    G = pooled_gram.double().cpu().numpy()

    def offset_of(idx_BN: np.ndarray) -> np.ndarray:
        return _offsets(G, _resample_weights(idx_BN, n))[0]

    return bootstrap_ci_indices(n, offset_of, n_boot=n_boot, level=level, seed=seed, batched=True)


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
    alignment: float  # mean over translation pairs of the `alignment_method` alignment (kme: `pair_alignment`)
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
    # from the same pooled Gram (kme only; NaN for gram_rows): the pooled-centring alignment (a third column,
    # dominated by the language offset), the language offset with its bootstrap, and the raw MMD
    alignment_pooled: float = math.nan
    language_offset: float = math.nan
    language_offset_lo: float = math.nan
    language_offset_hi: float = math.nan
    mmd: float = math.nan


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
        p = _resample_weights(idx_BN, n)
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
        off = language_offset(G)
        pooled = {"alignment_pooled": float(pooled_pair_alignment(G).mean()), "language_offset": off.offset,
                  "mmd": off.mmd}
    else:
        per_pair = pair_alignment_gram_rows(Kc, Lc, centered=True)
        pooled = {}
    value = float(per_pair.mean()) if alignment == "kme" else rows
    ci = {}
    if n_boot and n_x >= 2:
        from hybridlab.eval.stats import bootstrap_ci

        c = cka_bootstrap(K, L, n_boot, seed)
        a = bootstrap_ci(per_pair.double().cpu().numpy(), n_boot=n_boot, seed=seed)
        ci = {"cka_lo": c.lo, "cka_hi": c.hi, "alignment_lo": a.lo, "alignment_hi": a.hi}
        if alignment == "kme":
            o = offset_bootstrap(G, n_boot, seed)
            ci |= {"language_offset_lo": o.lo, "language_offset_hi": o.hi}
    return SoftCkaResult(**ci, **pooled, cka=cka_from_grams(Kc, Lc, centered=True),
                         cka_debiased=cka_from_grams(K, L, debiased=True),
                         alignment=value, alignment_gram_rows=rows, alignment_method=alignment,
                         sigma_eng=sigma_e, sigma_x=sigma_x, sigma_pair=sigma_pair,
                         sigma_convention=sigma_convention, n_sentences=n_x, method=method)


# --- the SoftCKA table of one eval_softcka_model job, and their gather -----------------------------------

SOFTCKA_TABLE_SORT = ("model", "pair", "kind", "layer", "lang")


def layer_groups(n_layers: int, per_pass: int) -> list[list[int]]:
    """Hidden-state indices 0..L in passes of `per_pass` (0 = all in one pass); attn_delta uses the same
    indices below L, so each pass captures <= 2 * per_pass token matrices per language."""
    idx = list(range(n_layers + 1))
    size = per_pass if per_pass > 0 else len(idx)
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def softcka_table(parallel: "pl.DataFrame", params: "SoftckaJob | dict", *, device: str | None = None, only: str | None = None,
                  log: Callable[[str], None] = print) -> "pl.DataFrame":
    """The SoftCKA table of every analysis model, or of the one named `only`: cross-lingual similarity of
    every layer, English vs each parallel language (workflow_scripts/eval_softcka.py: one eval_softcka_model
    job per model; `gather_softcka` joins their tables).

    `parallel`: the corpus table (sid, lang, text, source). `params`: the job's section
    (`hybridlab.config_spec.SoftckaJob`, or its dict): the models, dtype, seed, English code and the
    `eval.analysis.softcka` settings (languages absent: every language of the corpus). `device`: default
    `hybridlab.device.resolve_device()`. Progress goes to `log`.

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
      alignment  - mean per-pair alignment of `alignment_method` (kme, the headline: the centred cosine of
                   each pair's kernel mean embeddings in one space, each language's own mean removed;
                   gram_rows: cosine of centred Gram rows)
      alignment_gram_rows - the gram_rows variant (always reported)
      alignment_pooled - the kme cosine with one centring over both languages' sets (the language offset
                   stays in it); kme only, NaN for gram_rows
      language_offset, language_offset_lo/hi - MMD between the two languages' mean embeddings over the
                   within-language spread, with its bootstrap over pairs; mmd the raw distance (kme only)
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

    from hybridlab.config_spec import SoftckaJob, job_settings, to_dict

    job = job_settings(SoftckaJob, params, "eval_softcka.py")
    cfg = job.softcka
    english, seed = job.english, job.seed
    texts = pairs.parallel_sample(parallel, english, cfg.languages or None, cfg.n_sentences, seed)
    langs = [lang for lang in texts if lang != english]
    kinds = cfg.kinds
    device = resolve_device(device)
    method = cfg.method
    convention = cfg.sigma_convention
    alignment = cfg.alignment
    log(f"softcka: {len(texts[english])} sentences, English vs {langs}, kinds {kinds}, method {method}, "
        f"device {device}, sigma {convention}, alignment {alignment}")

    def gram(flat, off):
        if method == "exact":
            return sentence_gram(flat, off, block_tokens=cfg.block_tokens, device=device, seed=seed,
                                 sigma_convention=convention)
        return rff_sentence_gram(flat, off, cfg.rff_features, seed, device=device, sigma_convention=convention)

    models = pairs.analysis_models(**to_dict(job.models))
    if only is not None:
        models = [m for m in models if m.name == only]
        if not models:
            raise HybridlabError(f"softcka: no analysis model named {only!r} in --params models; pass one of the "
                                 "models the params list")
    rows = []
    for m in models:
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=job.dtype, device=device)
        types = pairs.layer_types(model)
        n_layers = len(types)
        for group in layer_groups(n_layers, cfg.layers_per_pass):
            delta = [layer for layer in group if layer < n_layers] if "attn_delta" in kinds else []
            hidden = group if "hidden" in kinds else []

            def capture(lang):
                return capture_hidden_states(model, tok, texts[lang], layers=hidden, delta_layers=delta,
                                             with_attn_delta=bool(delta), batch_size=cfg.batch_size)

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
                                   eng_gram=eng_grams[(kind, layer)], block_tokens=cfg.block_tokens, device=device,
                                   n_features=cfg.rff_features, seed=seed, sigma_convention=convention,
                                   alignment=alignment, n_boot=cfg.n_boot)
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
                                           "alignment_pooled": res.alignment_pooled,
                                           "language_offset": res.language_offset,
                                           "language_offset_lo": res.language_offset_lo,
                                           "language_offset_hi": res.language_offset_hi, "mmd": res.mmd,
                                           "n_sentences": res.n_sentences, "method": res.method,
                                           "sigma_eng": res.sigma_eng, "sigma_x": res.sigma_x,
                                           "sigma_pair": res.sigma_pair, "sigma_convention": res.sigma_convention})
        del model
        log(f"  {m.name}: {n_layers} layers, {time.perf_counter() - t0:.1f}s")

    table = pl.DataFrame(rows, schema_overrides={"sigma_pair": pl.Float64}).sort(*SOFTCKA_TABLE_SORT)
    log(str(table.group_by("model", "kind").agg(pl.col("cka").mean()).sort("model", "kind")))
    return table


def gather_softcka(paths: Sequence[str | Path], pairs: Sequence[str] | None = None) -> "pl.DataFrame":
    """The SoftCKA table from the per-model tables of the eval_softcka_model jobs: the rows a single job over
    every model writes, in the same order. `pairs`: keep these pairs' rows only (a teacher's table reused
    by a further replicate seed holds every first-seed pair). A damaged table, or one whose columns differ
    from the first one's, is one line naming it and how to rebuild it."""
    import polars as pl

    from hybridlab.atomic import rebuild_hint

    if not paths:
        raise HybridlabError("softcka: no per-model tables to gather")
    frames = []
    for path in paths:
        try:
            frames.append(pl.read_parquet(path))
        except (OSError, pl.exceptions.PolarsError) as exc:
            raise HybridlabError(f"softcka: {path} is damaged or not a parquet table; {rebuild_hint(path)}") from exc
        if frames[-1].schema != frames[0].schema:
            raise HybridlabError(f"softcka: {path} has other columns than {paths[0]}; {rebuild_hint(path)}")
    table = pl.concat(frames)
    if pairs is not None:
        missing = sorted(set(pairs) - set(table["pair"]))
        if missing:
            raise HybridlabError(f"softcka: no rows for pair(s) {', '.join(missing)} in the per-model tables; "
                                 "delete them and rerun `make all`")
        table = table.filter(pl.col("pair").is_in(list(pairs)))
    return table.sort(*SOFTCKA_TABLE_SORT, maintain_order=True)
