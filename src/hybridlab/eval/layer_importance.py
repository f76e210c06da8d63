"""Layer importance per language: how much the teacher's output moves when ONE layer's attention is replaced
by its stage-1-trained mixer, and how well that mixer imitates the attention it replaces.

Definitions (docs/methods.md, "Searched placements"):

- The mixers come from one stage-1 run on the ``all_mixers`` student (every layer converted), so each
  layer's mixer learnt to imitate its attention from the teacher's own inputs (stage-1 inputs
  "teacher"); the pass costs that one stage-1 run plus L + 1 forwards per batch.
- **KL score** of layer l on a sentence: the token-mean forward KL(p_teacher || p_l) of the next-token
  distributions, p_l the teacher with only layer l's attention swapped for its mixer, over the positions
  that predict a token of the sentence (t = 0..n-2).
- **Residual** of layer l on a sentence: the token-mean ||mixer_l(x_l) - attn_l(x_l)||^2 on the teacher's
  attention input x_l (stage 1's own loss, on held-out text); ``residual_rel`` divides it by the
  token-mean ||attn_l(x_l)||^2, so layers with large and small attention outputs compare.
- Sentences come from the parallel corpus, the LAST ``sentences`` of each language in sentence-id order
  (held-out rows built from the same corpus take the first ones), so the layers are chosen on text the
  placements are not later scored on.
- **Group score**: per language the token-weighted mean over its sentences, then the plain mean over the
  group's languages (each language weighs the same whatever its tokenizer fertility). Groups: ``all``,
  ``english``, ``latin`` (other Latin-script languages), ``nonlatin`` (every other script).
- **Intervals**: a bootstrap over sentences, stratified by language (each replicate redraws every
  language's sentences): the 95 % percentile interval of each layer's score and residual, and ``p_top``, how
  often the layer is among the n highest (n = the placements' FA count). ``chosen``: the point estimate's top n.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import torch
from torch import nn

from hybridlab.data.languages import SEARCH_GROUPS, language_group
from hybridlab.errors import HybridlabError
from hybridlab.models.placements import top_layers

ROW_SCHEMA = {"layer": pl.Int64, "lang": pl.String, "sid": pl.Int64, "kl_tokens": pl.Int64, "kl_sum": pl.Float64,
              "res_tokens": pl.Int64, "res_sum": pl.Float64, "ref_sum": pl.Float64}
SCORE_SCHEMA = {"group": pl.String, "layer": pl.Int64, "kl": pl.Float64, "kl_lo": pl.Float64, "kl_hi": pl.Float64,
                "residual": pl.Float64, "residual_lo": pl.Float64, "residual_hi": pl.Float64,
                "residual_rel": pl.Float64, "p_top": pl.Float64, "chosen": pl.Boolean, "n_fa": pl.Int64,
                "n_languages": pl.Int64, "n_sentences": pl.Int64}


def group_languages(langs: Sequence[str], english: str) -> dict[str, list[str]]:
    """Group -> its languages among `langs` (``all``: every one); groups without a language are left out."""
    out = {"all": list(langs)}
    for g in SEARCH_GROUPS[1:]:
        members = [lang for lang in langs if language_group(lang, english) == g]
        if members:
            out[g] = members
    return out


def importance_sentences(parallel: pl.DataFrame, languages: Sequence[str], n: int) -> pl.DataFrame:
    """lang, sid, text: the last `n` sentences of each language by sentence id (see the module docstring)."""
    out = []
    for lang in languages:
        rows = parallel.filter(pl.col("lang") == lang).sort("sid")
        if rows.height < n:
            raise HybridlabError(f"layer importance: the parallel corpus has {rows.height} sentences of {lang}, "
                                 f"fewer than the {n} asked for; lower eval.layer_importance.sentences")
        out.append(rows.tail(n).select("lang", "sid", "text"))
    return pl.concat(out)


@torch.no_grad()
def score_layers(teacher: nn.Module, mixers: dict[int, nn.Module], sentences: Sequence[Sequence[int]],
                 langs: Sequence[str], sids: Sequence[int], batch_size: int = 8) -> pl.DataFrame:
    """One row per layer x sentence (``ROW_SCHEMA``): summed KL and residual terms, for the scores above.

    `mixers`: layer -> a module called like the layer's ``self_attn`` (a MixerAttention of the stage-1
    student); the teacher's ``self_attn`` of that layer is swapped for it during its forward and put back.
    Batches are right-padded: every model here is causal, so padding after a sentence never reaches it.
    """
    from hybridlab.train.distill import AttentionCapture, decoder_layers

    layers = decoder_layers(teacher)
    order = sorted(mixers)
    bad = [i for i in order if not 0 <= i < len(layers)]
    if bad:
        raise HybridlabError(f"mixers for layers {bad} do not exist in a {len(layers)}-layer teacher")
    short = [i for i, s in enumerate(sentences) if len(s) < 2]
    if short:
        raise HybridlabError(f"sentences {short[:5]} have fewer than 2 tokens; drop them before scoring")
    device = next(teacher.parameters()).device
    rows = []
    capture = AttentionCapture(teacher, order, keep_inputs=False)
    n_batches = -(-len(sentences) // batch_size)
    try:
        for b0 in range(0, len(sentences), batch_size):
            print(f"layer importance: batch {b0 // batch_size + 1}/{n_batches} ({len(order)} layers)", flush=True)
            batch = [list(map(int, s)) for s in sentences[b0:b0 + batch_size]]
            lengths = [len(s) for s in batch]
            width = max(lengths)
            ids = torch.tensor([s + [0] * (width - len(s)) for s in batch], device=device)
            n = torch.tensor(lengths, device=device)
            real = torch.arange(width, device=device)[None, :] < n[:, None]
            scored = real.clone()
            scored[torch.arange(len(batch)), n - 1] = False  # the last token predicts nothing in the sentence
            kl_tokens = scored.sum(-1).tolist()
            capture.clear()
            logp_t = torch.log_softmax(teacher(input_ids=ids).logits.float(), dim=-1)
            p_t = logp_t.exp()
            outputs = dict(capture.outputs)
            capture.clear()
            for layer in order:
                # layers below `layer` are the teacher's, so the swapped-in mixer sees the teacher's own input
                # x_l; its output, caught on the way, gives the residual
                seen = {}
                hook = mixers[layer].register_forward_hook(
                    lambda _m, _a, out: seen.__setitem__("y", out[0] if isinstance(out, tuple) else out))
                attn = layers[layer].self_attn
                layers[layer].self_attn = mixers[layer]
                try:
                    logp_r = torch.log_softmax(teacher(input_ids=ids).logits.float(), dim=-1)
                finally:
                    layers[layer].self_attn = attn
                    hook.remove()
                capture.clear()
                ref = outputs[layer].float()
                res = ((seen["y"].float() - ref).pow(2).sum(-1) * real).sum(-1).tolist()
                ref2 = (ref.pow(2).sum(-1) * real).sum(-1).tolist()
                kl = ((p_t * (logp_t - logp_r)).sum(-1) * scored).sum(-1).tolist()
                rows += [{"layer": layer, "lang": langs[b0 + j], "sid": int(sids[b0 + j]), "kl_tokens": kl_tokens[j],
                          "kl_sum": kl[j], "res_tokens": lengths[j], "res_sum": res[j], "ref_sum": ref2[j]}
                         for j in range(len(batch))]
    finally:
        capture.remove()
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def _language_sums(rows: pl.DataFrame, lang: str, layers: list[int]) -> tuple[np.ndarray, ...]:
    """(kl_sum, kl_tokens, res_sum, res_tokens, ref_sum) as [layer, sentence] arrays of one language."""
    g = rows.filter(pl.col("lang") == lang).sort("layer", "sid")
    sids = g.filter(pl.col("layer") == layers[0])["sid"].to_list()
    shape = (len(layers), len(sids))
    if g.height != shape[0] * shape[1]:
        raise HybridlabError(f"layer importance rows of {lang} do not hold every layer x sentence; rerun the pass")
    return tuple(g[c].to_numpy().astype(float).reshape(shape) for c in
                 ("kl_sum", "kl_tokens", "res_sum", "res_tokens", "ref_sum"))


def group_scores(rows: pl.DataFrame, english: str, n_fa: int, *, n_boot: int = 200, seed: int = 0,
                 level: float = 0.95) -> pl.DataFrame:
    """Per group x layer: KL score with its bootstrap interval, residuals, p_top and chosen (module docstring)."""
    if rows.is_empty():
        raise HybridlabError("layer importance: no rows to summarise")
    layers = sorted(rows["layer"].unique().to_list())
    langs = list(dict.fromkeys(rows["lang"].to_list()))
    sums = {lang: _language_sums(rows, lang, layers) for lang in langs}
    rng = np.random.default_rng(seed)
    # per language: [n_boot, n_sentences] resampling counts (the same draws for every group and layer)
    counts = {lang: rng.multinomial(s[0].shape[1], np.full(s[0].shape[1], 1 / s[0].shape[1]), size=n_boot)
              for lang, s in sums.items()}

    def lang_means(lang, weights=None, residual=False):
        kl, n, res, n_res, _ = sums[lang]
        value, count = (res, n_res) if residual else (kl, n)
        if weights is None:
            return value.sum(1) / count.sum(1)  # [layer]
        return (weights @ value.T) / (weights @ count.T)  # [n_boot, layer]

    out = []
    alpha = (1 - level) / 2
    for group, members in group_languages(langs, english).items():
        point = np.mean([lang_means(lang) for lang in members], axis=0)
        boot = np.mean([lang_means(lang, counts[lang]) for lang in members], axis=0)
        lo, hi = np.quantile(boot, [alpha, 1 - alpha], axis=0)
        chosen = set(top_layers(point.tolist(), n_fa))
        top_hits = np.zeros(len(layers))
        for b in range(n_boot):
            for i in top_layers(boot[b].tolist(), n_fa):
                top_hits[i] += 1
        res = np.mean([lang_means(lang, residual=True) for lang in members], axis=0)
        res_lo, res_hi = np.quantile(np.mean([lang_means(lang, counts[lang], residual=True) for lang in members],
                                             axis=0), [alpha, 1 - alpha], axis=0)
        rel = np.mean([sums[lang][2].sum(1) / np.maximum(sums[lang][4].sum(1), 1e-30) for lang in members], axis=0)
        n_sent = sum(sums[lang][0].shape[1] for lang in members)
        for i, layer in enumerate(layers):
            out.append({"group": group, "layer": layer, "kl": float(point[i]), "kl_lo": float(lo[i]),
                        "kl_hi": float(hi[i]), "residual": float(res[i]), "residual_lo": float(res_lo[i]),
                        "residual_hi": float(res_hi[i]), "residual_rel": float(rel[i]),
                        "p_top": float(top_hits[i] / n_boot), "chosen": i in chosen, "n_fa": n_fa,
                        "n_languages": len(members), "n_sentences": n_sent})
    return pl.DataFrame(out, schema=SCORE_SCHEMA)


def searched_layers(scores: pl.DataFrame, group: str, num_layers: int, n_fa: int) -> tuple[list[int], list[float]]:
    """(FA layers, KL scores by layer) of a searched placement from a `group_scores` table."""
    g = scores.filter(pl.col("group") == group).sort("layer")
    if g.is_empty():
        have = ", ".join(scores["group"].unique(maintain_order=True).to_list())
        raise HybridlabError(f"the layer importance table has no group {group!r} (has: {have}); add a language of "
                             "that group to eval.layer_importance.languages")
    if g["layer"].to_list() != list(range(num_layers)):
        raise HybridlabError(f"the layer importance table scores layers {g['layer'].to_list()}, not the teacher's "
                             f"{num_layers}; rebuild it from this teacher's all_mixers student")
    kl = g["kl"].to_list()
    return top_layers(kl, n_fa), kl
