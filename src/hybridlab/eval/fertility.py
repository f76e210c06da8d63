"""Tokenizer fertility: tokens per sentence, relative to English, on a parallel corpus.

Input: the project's parallel schema (`sid, lang, text, source`; one row per sentence id and language).
Definitions, per tokenizer and language X, over the sids present in BOTH X and English (the parallel
subset, so every ratio compares translations of the same sentences):

- `tokens_per_sentence` = mean over those sids of n_X(sid), the token count of X's text without special
  tokens (BOS/EOS are a per-sequence constant, not a property of the language);
- `relative_to_english` (THE HEADLINE) = sum_sid n_X(sid) / sum_sid n_eng(sid), the ratio of totals
  (= ratio of means). It is what a model pays for X in context length and compute, and is robust to
  very short sentences;
- `mean_sentence_ratio` = mean_sid n_X(sid) / n_eng(sid), the mean of per-sentence ratios (reported
  too; short English sentences make it noisier and larger than the headline).
- `relative_to_english_lo` / `_hi`: percentile bootstrap over the shared sids (`n_boot` replicates, seed
  `seed`; the sentence pair is the unit: n_X and n_eng of a drawn sid enter together); NaN with n_boot 0.

English itself gets ratios of exactly 1. Tokenizers may be a Hugging Face tokenizer (called with
`add_special_tokens=False`), a `tokenizers.Tokenizer` (`encode_batch(..., add_special_tokens=False)`),
or any callable text -> sequence of tokens.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.eval.stats import bootstrap_ci_indices

OUTPUT_SCHEMA = {"tokenizer": pl.String, "lang": pl.String, "n_sentences": pl.Int64,
                 "tokens_per_sentence": pl.Float64, "relative_to_english": pl.Float64,
                 "mean_sentence_ratio": pl.Float64, "relative_to_english_lo": pl.Float64,
                 "relative_to_english_hi": pl.Float64}


def token_counts(tokenizer: Any, texts: Sequence[str]) -> list[int]:
    """Number of tokens of each text (no special tokens)."""
    texts = list(texts)
    if hasattr(tokenizer, "encode_batch"):  # tokenizers.Tokenizer
        return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]
    if hasattr(tokenizer, "all_special_ids"):  # transformers tokenizer
        return [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    if callable(tokenizer):
        return [len(tokenizer(t)) for t in texts]
    raise HybridlabError(f"unsupported tokenizer type {type(tokenizer).__name__}; pass a transformers "
                         "tokenizer, a tokenizers.Tokenizer or a callable text -> tokens")


def fertility(parallel: pl.DataFrame, tokenizers: Mapping[str, Any | Callable[[str], Sequence]], *,
              english: str = "eng_Latn", n_boot: int = 1000, seed: int = 0) -> pl.DataFrame:
    """Tidy fertility table: one row per (tokenizer, language), English included."""
    missing = {"sid", "lang", "text"} - set(parallel.columns)
    if missing:
        raise HybridlabError(f"parallel data lacks columns {sorted(missing)}; expected schema sid, lang, text, source")
    if not tokenizers:
        raise HybridlabError("no tokenizers given; pass a {name: tokenizer} mapping")
    dup = parallel.group_by("sid", "lang").len().filter(pl.col("len") > 1)
    if dup.height:
        raise HybridlabError(f"{dup.height} (sid, lang) pairs occur more than once (e.g. {dup.row(0)[:2]}); "
                             "deduplicate the parallel data first")
    if parallel.filter(pl.col("lang") == english).height == 0:
        raise HybridlabError(f"no {english} rows in the parallel data; fertility is relative to English")
    rows = []
    for name, tok in tokenizers.items():
        counted = parallel.select("sid", "lang", "text").with_columns(
            pl.Series("n_tokens", token_counts(tok, parallel["text"].to_list()), dtype=pl.Int64))
        eng = counted.filter(pl.col("lang") == english).select("sid", pl.col("n_tokens").alias("n_eng"))
        zero = eng.filter(pl.col("n_eng") == 0)
        if zero.height:
            raise HybridlabError(f"tokenizer {name!r} gives 0 tokens for English sid {zero['sid'][0]!r}; "
                                 "drop empty sentences from the parallel data")
        joined = counted.join(eng, on="sid", how="inner")
        orphan = set(counted["lang"].unique()) - set(joined["lang"].unique())
        if orphan:
            raise HybridlabError(f"languages {sorted(orphan)} share no sid with {english}; fertility needs "
                                 "parallel sentences - drop them or fix their sids")
        stats = (joined.group_by("lang")
                 .agg(pl.len().alias("n_sentences"),
                      pl.col("n_tokens").mean().alias("tokens_per_sentence"),
                      (pl.col("n_tokens").sum() / pl.col("n_eng").sum()).alias("relative_to_english"),
                      (pl.col("n_tokens") / pl.col("n_eng")).mean().alias("mean_sentence_ratio"))
                 .with_columns(pl.lit(name).alias("tokenizer")))
        cis = []
        for lang in stats["lang"].to_list():
            g = joined.filter(pl.col("lang") == lang)
            nx, ne = g["n_tokens"].to_numpy().astype(float), g["n_eng"].to_numpy().astype(float)
            if n_boot and lang != english and nx.size >= 2:
                ci = bootstrap_ci_indices(nx.size, lambda i: float(nx[i].sum() / ne[i].sum()), n_boot=n_boot,
                                          seed=seed)
                cis.append((lang, ci.lo, ci.hi))
            else:  # English is exactly 1; no bootstrap asked or one sentence: no interval
                one = 1.0 if lang == english else float("nan")
                cis.append((lang, one, one))
        stats = stats.join(pl.DataFrame(cis, schema={"lang": pl.String, "relative_to_english_lo": pl.Float64,
                                                     "relative_to_english_hi": pl.Float64}, orient="row"), on="lang")
        rows.append(stats)
    out = pl.concat(rows).select(list(OUTPUT_SCHEMA)).cast(OUTPUT_SCHEMA)
    return out.sort("tokenizer", "lang")
