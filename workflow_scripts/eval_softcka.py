"""SoftCKA table: cross-lingual similarity of every layer, English vs each parallel language, per model.

For every analysis model (`hybridlab.eval.pairs`: distilled student vs teacher; hub pairs at the paper
preset) the same N parallel sentences (a seeded sample of sids present in English and every analysed
language) are run through the model per language; for each representation kind and layer, SoftCKA,
its debiased variant and the mean per-pair alignment are computed between English and language X
(`hybridlab.eval.softcka`; the English Gram is computed once per layer and shared by all languages, the
defined pair alignment needs one pooled Gram of both languages per language). `softcka.sigma_convention`
(median_distance | median_sq_distance, default median_distance) sets the bandwidth convention and
`softcka.alignment` (kme | gram_rows, default kme) the pair alignment reported in `alignment`.

Output `--out` (tidy parquet), one row per (model, pair, kind, layer, lang):
  model, pair, role (hybrid | dense)  - the analysed model and each pair it belongs to (rows repeat per pair)
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
               (`softcka.n_boot` replicates, seed `seed`; NaN with n_boot 0): CKA recomputed from both Grams'
               rows and columns at the resampled sentences; the mean of the resampled per-pair alignments
  n_sentences, method (exact | rff), sigma_eng, sigma_x (RBF bandwidths), sigma_pair (the pooled bandwidth
  of the kme alignment; null for gram_rows), sigma_convention
"""

import time

import _common


def _layer_groups(n_layers: int, per_pass: int) -> list[list[int]]:
    """Hidden-state indices 0..L in passes of `per_pass` (0 = all in one pass); attn_delta uses the same
    indices below L, so each pass captures <= 2 * per_pass token matrices per language."""
    idx = list(range(n_layers + 1))
    size = per_pass if per_pass > 0 else len(idx)
    return [idx[i:i + size] for i in range(0, len(idx), size)]


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--parallel", required=True, help="parallel corpus parquet (sid, lang, text, source)")
    p.add_argument("--out", required=True, help="output table (.parquet)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl

    from hybridlab.eval import pairs
    from hybridlab.eval.capture import capture_hidden_states
    from hybridlab.eval.softcka import rff_sentence_gram, sentence_gram, soft_cka

    cfg = params["softcka"]
    english = params["english"]
    texts = pairs.parallel_sample(pl.read_parquet(args.parallel), english, cfg.get("languages"),
                                  cfg["n_sentences"], params["seed"])
    langs = [lang for lang in texts if lang != english]
    kinds = cfg["kinds"]
    device = pairs.analysis_device()
    method = cfg["method"]
    n_sent = len(texts[english])
    convention = cfg.get("sigma_convention", "median_distance")
    alignment = cfg.get("alignment", "kme")
    print(f"softcka: {n_sent} sentences, English vs {langs}, kinds {kinds}, method {method}, device {device}, "
          f"sigma {convention}, alignment {alignment}")

    def gram(flat, off):
        if method == "exact":
            return sentence_gram(flat, off, block_tokens=cfg["block_tokens"], device=device, seed=params["seed"],
                                 sigma_convention=convention)
        return rff_sentence_gram(flat, off, cfg["rff_features"], params["seed"], device=device,
                                 sigma_convention=convention)

    rows = []
    for m in pairs.analysis_models(**params["models"]):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=params["dtype"], device=device)
        types = pairs.layer_types(model)
        n_layers = len(types)
        for group in _layer_groups(n_layers, cfg["layers_per_pass"]):
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
                                   n_features=cfg["rff_features"], seed=params["seed"], sigma_convention=convention,
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
        print(f"  {m.name}: {n_layers} layers, {time.perf_counter() - t0:.1f}s")

    table = pl.DataFrame(rows, schema_overrides={"sigma_pair": pl.Float64}).sort("model", "pair", "kind", "layer", "lang")
    pairs.write_table(table, args.out)
    summary = table.group_by("model", "kind").agg(pl.col("cka").mean()).sort("model", "kind")
    print(summary)


if __name__ == "__main__":
    _common.run(main)
