"""The multilinguality findings beyond the placement, SoftCKA and NIAH headline rows of `findings`: the attention
output at the first FA layer, no reorganisation in sliding-window models, recency, fertility, NIAH runtime,
the top KL-reduction languages of both teachers, the non-Latin-script gain and reverse periodic against the
teacher (docs/methods.md "Findings table" defines each effect, interval and the presets that have its data).

Verdicts follow `findings.decide`: observational findings on fixed published models (or tokenizers) decide
from their evaluation-unit interval; findings on models the DAG trains (distilled students) decide from an
interval across >= 2 seeds and are "inconclusive" (one seed) otherwise. A finding whose data is missing or
undefined (no dense partner, no FA layer, no language of a script) is a note row, never "reproduced".
"""

from __future__ import annotations

import math
from itertools import combinations

import numpy as np
import polars as pl

from hybridlab.eval import stats
from hybridlab.plots import verdicts as F

FERTILITY_REFERENCE = "utf8_bytes"  # the byte-level reference tokenizer of the fertility table, not a model's
STUDY_YORUBA = 2.6  # Yoruba's tokens per English token with Qwen3.5's tokenizer
STUDY_MAX_FERTILITY = 10.0  # the largest ratio the study reports (OLMo's tokenizer)
STUDY_TOP_K = 8  # the study: the same 8 languages gain most KL reduction under both teachers
STUDY_TEACHER_GAP = 0.01  # reverse periodic comes within 0.01 nat of the (Granite) teacher's CE
STUDY_CLOSER = 0.10  # ... and 10 % closer to the teacher than the other placements
STUDY_LOWEST = (16, 26)  # ... with the lowest CE in 16 of 26 languages

ATTN_DELTA_FA = "the attention output stands out at the hybrid's first FA layer (SoftCKA of attn_delta)"
SWA_FLAT = "sliding-window models show no SoftCKA reorganisation at their first global-attention layer"
RECENCY = "hybrid FA layers attend more to recent tokens than the dense model's"
FERTILITY_YOR = "Yoruba costs more tokens than English (study: 2.6x with Qwen3.5's tokenizer)"
FERTILITY_MAX = "the most expensive language costs more tokens than English (study: up to 10x with OLMo's tokenizer)"
NIAH_RUNTIME = "hybrids run long-context NIAH faster than dense models"
TOP_KL = "the same languages gain most KL reduction under both teachers (study: the same top 8)"
NON_LATIN = "the KL reduction is largest in non-Latin scripts"
REV_GAP = "reverse periodic comes within 0.01 nat of the teacher's held-out CE (study: Granite teacher)"
REV_CLOSER = "reverse periodic is closer to the teacher than the other placements (study: 10 % closer)"
REV_LOWEST = "reverse periodic has the lowest CE in most languages (study: 16 of 26)"


def _skip(finding: str, comparison: str, expected: int, source: str, why: str, n_seeds: int = 0) -> dict:
    return F._row(F.MULTI, finding, comparison, "", expected, math.nan, math.nan, math.nan, "none", n_seeds, "",
                  math.nan, source, "skipped: " + why, verdict=stats.INCONCLUSIVE)


def is_latin(lang: str) -> bool:
    """Latin script by the code's ISO 15924 part (`fra_Latn`)."""
    return lang.rsplit("_", 1)[-1] == "Latn"


# --- SoftCKA: the attention output at the first FA layer; sliding-window models ---------------------------

def _kind(table: pl.DataFrame | None, kind: str) -> pl.DataFrame | None:
    if table is None or not table.height or "kind" not in table.columns:
        return None
    return table.filter(pl.col("kind") == kind)


def extreme_margins(hybrid_rows: pl.DataFrame, metric: str) -> tuple[int | None, dict[str, float]]:
    """(first FA layer f, {lang: margin}) of one hybrid's attn_delta rows (columns layer, layer_type, lang,
    `metric`; row l is decoder layer l's token-mixer output, a value per layer, not a running state). With m the
    median of the layers' values, margin = |a(f) - m| - max_{l != f} |a(l) - m|: positive exactly when the first
    FA layer's output lies furthest from the typical layer's (0 when equal up to rounding, 1e-12 of the largest
    deviation). A language with fewer than three layers gets no margin."""
    fa = hybrid_rows.filter(pl.col("layer_type") == F.FULL_ATTENTION)["layer"]
    if fa.is_empty():
        return None, {}
    f = int(fa.min())
    out = {}
    for (lang,), g in hybrid_rows.sort(["lang", "layer"]).group_by(["lang"], maintain_order=True):
        vals = dict(zip(g["layer"].to_list(), g[metric].to_list()))
        if f not in vals or len(vals) < 3 or not all(v is not None and math.isfinite(v) for v in vals.values()):
            continue
        m = float(np.median(list(vals.values())))
        dev = {layer: abs(v - m) for layer, v in vals.items()}
        margin = dev[f] - max(d for layer, d in dev.items() if layer != f)
        out[lang] = 0.0 if abs(margin) <= 1e-12 * max(max(dev.values()), 1e-300) else margin
    return f, out


def attn_delta_rows(softcka: pl.DataFrame, softcka_seeds: pl.DataFrame | None = None) -> list[dict]:
    """Per hybrid-vs-dense pair: `extreme_margins` of the hybrid's attn_delta alignment (whether the first
    attention output stands out from every other layer's); mean margin over languages, expected +."""
    att = _kind(softcka, "attn_delta")
    if att is None or not att.height or not {"pair", "role", "lang", "layer", "layer_type", "alignment"} <= set(
            att.columns):
        return []
    extra = _kind(softcka_seeds, "attn_delta")
    models = F.pair_models(att)
    out = []
    for pair in sorted(models):
        if models[pair].get("dense") is None:
            continue  # a sliding-window model: SWA_FLAT
        rule = F._analysis_rule(pair, models[pair], "languages")
        f, margins = extreme_margins(att.filter((pl.col("pair") == pair) & (pl.col("role") == "hybrid")),
                                     "alignment")
        if f is None or not margins:
            out.append(_skip(ATTN_DELTA_FA, pair, +1, "softcka", "the hybrid has no full-attention layer" if f is None
                             else "fewer than three layers per language", rule["n_seeds"]))
            continue
        d = [margins[k] for k in sorted(margins)]
        lo, hi = F._boot_over(d)
        row = F._row(F.MULTI, ATTN_DELTA_FA, pair,
                     f"mean over languages of the attention-output alignment's distance from its median over layers "
                     f"at the first FA layer (decoder layer {f}) minus the largest such distance at any other layer, "
                     "hybrid only", +1, float(np.mean(d)), lo, hi, rule["ci_over"], rule["n_seeds"],
                     "sign test over languages", F._sign_p(d), "softcka", f"the first FA layer's output is the most "
                     f"extreme in {sum(x > 0 for x in d)} of {len(d)} languages", units=rule["units"],
                     students=rule["students"])

        def margin_mean(rows):
            m = extreme_margins(rows.filter(pl.col("role") == "hybrid"), "alignment")[1]
            return float(np.mean(list(m.values()))) if m else math.nan

        if not F.is_published(pair, models[pair].get("hybrid")):
            row = F._over_seeds(row, F._seed_effects(att, extra, pair, margin_mean))
        out.append(row)
    return out


def swa_rows(softcka: pl.DataFrame) -> list[dict]:
    """Per pair without a dense model (a sliding-window model listed alone): the first-FA margin of its hidden
    alignment (`findings.first_fa_margins`, FA = its global-attention layers), expected - (the largest change
    is NOT at the first global layer: no reorganisation there)."""
    hid = _kind(softcka, "hidden")
    if hid is None or not hid.height or not {"pair", "role", "layer", "layer_type", "alignment"} <= set(hid.columns):
        return []
    models = F.pair_models(hid)
    out = []
    for pair in sorted(p for p in models if models[p].get("dense") is None):
        rule = F._analysis_rule(pair, models[pair], "languages")
        f, margins = F.first_fa_margins(hid.filter((pl.col("pair") == pair) & (pl.col("role") == "hybrid")),
                                        "alignment")
        if f is None or not margins:
            out.append(_skip(SWA_FLAT, pair, -1, "softcka", "the model has no global (full-attention) layer"
                             if f is None else "fewer than two layer-to-layer changes per language", rule["n_seeds"]))
            continue
        d = [margins[k] for k in sorted(margins)]
        lo, hi = F._boot_over(d)
        out.append(F._row(F.MULTI, SWA_FLAT, pair, f"mean over languages of |change of alignment| at the first "
                          f"global-attention layer (hidden row {f}) minus the largest |change| at any other layer",
                          -1, float(np.mean(d)), lo, hi, rule["ci_over"], rule["n_seeds"], "sign test over languages",
                          F._sign_p(d), "softcka", f"largest |change| at the first global layer in "
                          f"{sum(x > 0 for x in d)} of {len(d)} languages", units=rule["units"],
                          students=rule["students"]))
    return out


# --- attention recency ----------------------------------------------------------------------------------

def recency_rows(recency: pl.DataFrame | None) -> list[dict]:
    """Per hybrid-vs-dense pair, at the smallest window w both models have: per language, the hybrid's attention
    mass on the last w keys (mean over its FA layers and heads) minus the dense model's at the same decoder
    layers (all its layers when it lacks one of them); mean over languages, bootstrap over languages,
    expected +."""
    need = {"pair", "role", "lang", "layer", "head", "window", "mass"}
    if recency is None or not recency.height or not need <= set(recency.columns):
        return []
    models = F.pair_models(recency)
    out = []
    for pair in sorted(models):
        if models[pair].get("dense") is None:
            out.append(F._no_dense_row(RECENCY, pair, "recency", +1))
            continue
        g = recency.filter(pl.col("pair") == pair)
        h, d = g.filter(pl.col("role") == "hybrid"), g.filter(pl.col("role") == "dense")
        windows = sorted(set(h["window"].to_list()) & set(d["window"].to_list()))
        rule = F._analysis_rule(pair, models[pair], "languages")
        if not windows or not h.height or not d.height:
            out.append(_skip(RECENCY, pair, +1, "recency", "the two models share no window", rule["n_seeds"]))
            continue
        w = windows[0]
        h, d = h.filter(pl.col("window") == w), d.filter(pl.col("window") == w)
        fa = sorted(set(h["layer"].to_list()))
        same_depth = set(fa) <= set(d["layer"].to_list())
        if same_depth:
            d = d.filter(pl.col("layer").is_in(fa))
        hm = h.group_by("lang").agg(pl.col("mass").mean().alias("h"))
        dm = d.group_by("lang").agg(pl.col("mass").mean().alias("d"))
        j = hm.join(dm, on="lang").drop_nulls().sort("lang")
        diffs = (j["h"] - j["d"]).to_list()
        if not diffs:
            out.append(_skip(RECENCY, pair, +1, "recency", "no language measured for both models", rule["n_seeds"]))
            continue
        lo, hi = F._boot_over(diffs)
        note = (f"window {w}; hybrid FA layers {fa} vs the dense model's "
                + ("same layers" if same_depth else "layers (all: it lacks some of the hybrid's FA layer indices)"))
        out.append(F._row(F.MULTI, RECENCY, pair, f"attention mass on the last {w} keys (mean over FA layers and "
                          "heads), hybrid minus dense, mean over languages", +1, float(np.mean(diffs)), lo, hi,
                          rule["ci_over"], rule["n_seeds"], "sign test over languages", F._sign_p(diffs), "recency",
                          note, units=rule["units"], students=rule["students"]))
    return out


# --- tokenizer fertility ---------------------------------------------------------------------------------

def _fertility_row(finding: str, tok: str, r: dict, study: float, study_tok: str) -> dict:
    ratio, lo, hi = r["relative_to_english"], r.get("relative_to_english_lo"), r.get("relative_to_english_hi")
    lo = math.nan if lo is None else lo
    hi = math.nan if hi is None else hi
    note = f"{r['lang']}: {F._f(ratio)}x English's tokens over {r['n_sentences']} parallel sentences"
    if study_tok in tok.lower():
        vs = F._versus_study(lo, hi, study)
        note += f" (study: {study:g}x with this tokenizer" + (f"; {vs})" if vs else ")")
    effect = ratio - 1.0
    verdict = (stats.verdict(effect, (lo - 1.0, hi - 1.0), +1) if math.isfinite(lo) and math.isfinite(hi)
               else stats.INCONCLUSIVE)
    return F._row(F.MULTI, finding, f"tokenizer {tok}: {r['lang']}", "tokens relative to English (ratio of token "
                  "totals over shared parallel sentences) minus 1", +1, effect, lo - 1.0, hi - 1.0,
                  "sentences (bootstrap; fixed tokenizer)", 0, "", math.nan, "fertility",
                  "fixed tokenizer: interval over sentences" + ("" if math.isfinite(lo) and math.isfinite(hi) else
                                                                " (none: no bootstrap)") + "; " + note,
                  verdict=verdict)


def fertility_rows(fertility: pl.DataFrame | None, english: str = F.ENGLISH) -> list[dict]:
    """Per tokenizer (the byte reference left out): Yoruba's ratio to English (when the corpus has yor_Latn) and
    the largest ratio of any language, each minus 1 with its sentence bootstrap, expected +. A tokenizer is a
    fixed object: the row decides from its sentence interval."""
    need = {"tokenizer", "lang", "relative_to_english", "n_sentences"}
    if fertility is None or not fertility.height or not need <= set(fertility.columns):
        return []
    out = []
    for (tok,), g in fertility.sort(["tokenizer", "lang"]).group_by(["tokenizer"], maintain_order=True):
        if tok == FERTILITY_REFERENCE:
            continue
        g = g.filter((pl.col("lang") != english) & pl.col("relative_to_english").is_not_nan())
        if not g.height:
            continue
        yor = g.filter(pl.col("lang") == "yor_Latn")
        if yor.height:
            out.append(_fertility_row(FERTILITY_YOR, tok, yor.row(0, named=True), STUDY_YORUBA, "qwen3.5"))
        top = g.sort(["relative_to_english", "lang"], descending=[True, False]).row(0, named=True)
        out.append(_fertility_row(FERTILITY_MAX, tok, top, STUDY_MAX_FERTILITY, "olmo"))
    return out


# --- NIAH runtime ----------------------------------------------------------------------------------------

def niah_runtime_rows(niah: pl.DataFrame | None) -> list[dict]:
    """Per hybrid-vs-dense pair, at the longest context with a language x task cell both models completed
    without OOM: per cell log(mean seconds per example, hybrid / dense); mean over cells, bootstrap over cells,
    expected - (the hybrid is faster). Seconds are wall time on the device the job ran on (docs/methods.md)."""
    need = {"pair", "role", "lang", "task", "context_tokens", "seconds", "n"}
    if niah is None or not niah.height or not need <= set(niah.columns):
        return []
    df = niah if "n_oom" in niah.columns else niah.with_columns(n_oom=pl.lit(0, pl.Int64))
    models = F.pair_models(df)
    out = []
    for pair in sorted(models):
        if models[pair].get("dense") is None:
            out.append(F._no_dense_row(NIAH_RUNTIME, pair, "niah", -1))
            continue
        rule = F._analysis_rule(pair, models[pair], "language x task cells")
        g = df.filter((pl.col("pair") == pair) & (pl.col("n") > 0) & (pl.col("n_oom") == 0)
                      & pl.col("seconds").is_not_null() & (pl.col("seconds") > 0))
        wide = (g.group_by(["lang", "task", "context_tokens", "role"]).agg(pl.col("seconds").mean())
                .pivot(on="role", index=["lang", "task", "context_tokens"], values="seconds"))
        if not {"hybrid", "dense"} <= set(wide.columns) or not wide.drop_nulls(["hybrid", "dense"]).height:
            out.append(_skip(NIAH_RUNTIME, pair, -1, "niah", "no language x task cell completed by both models",
                             rule["n_seeds"]))
            continue
        wide = wide.drop_nulls(["hybrid", "dense"])
        ctx = int(wide["context_tokens"].max())
        cells = wide.filter(pl.col("context_tokens") == ctx).sort(["lang", "task"])
        logs = [math.log(a / b) for a, b in cells.select("hybrid", "dense").iter_rows()]
        lo, hi = F._boot_over(logs)
        note = (f"at {ctx} tokens over {len(logs)} cells: mean {float(cells['hybrid'].mean()):.3g} s per example "
                f"(hybrid) vs {float(cells['dense'].mean()):.3g} s (dense); wall time on the device the job ran on")
        out.append(F._row(F.MULTI, NIAH_RUNTIME, pair, f"log(seconds per example, hybrid / dense) at {ctx} tokens, "
                          "mean over language x task cells both models completed without OOM", -1,
                          float(np.mean(logs)), lo, hi, rule["ci_over"], rule["n_seeds"], "sign test over cells",
                          F._sign_p(logs), "niah", note, units=rule["units"], students=rule["students"]))
    return out


# --- distillation: KL reduction by language, reverse periodic against the teacher -------------------------

def _pooled(rows: pl.DataFrame, keys: list[str], value: str) -> pl.DataFrame:
    """Token-pooled `value` per `keys`: sum(value x n_tokens) / sum(n_tokens)."""
    return (rows.filter(pl.col(value).is_not_null()).group_by(keys)
            .agg(((pl.col(value) * pl.col("n_tokens")).sum() / pl.col("n_tokens").sum()).alias(value)))


def kl_reductions(rows: pl.DataFrame, baseline: str, english: str = F.ENGLISH) -> pl.DataFrame:
    """Per (teacher, mixer, lang, seed): 1 - KL(best, s) / KL(baseline, s), the best placement the one with the
    lowest seed-mean KL of that language (`tables.kl_reduction_table`'s reduction, per seed); English left out."""
    stud = rows.filter(pl.col("placement").is_not_null() & (pl.col("lang") != english))
    kl = _pooled(stud, ["teacher", "mixer", "placement", "lang", "seed"], "kl")
    keys = ["teacher", "mixer", "lang"]
    mean = kl.group_by(keys + ["placement"]).agg(pl.col("kl").mean())
    best = (mean.filter(pl.col("placement") != baseline).sort(["kl", "placement"]).group_by(keys, maintain_order=True)
            .first().select(*keys, best="placement"))
    base = kl.filter(pl.col("placement") == baseline).select(*keys, "seed", base="kl")
    return (kl.join(best, on=keys).filter(pl.col("placement") == pl.col("best")).join(base, on=keys + ["seed"])
            .with_columns(reduction=1.0 - pl.col("kl") / pl.col("base")).select(*keys, "seed", "best", "reduction"))


def hypergeometric_tail(overlap: int, n: int, k: int) -> float:
    """P(X >= overlap) for the overlap X of two independent uniformly random k-subsets of n items."""
    total = math.comb(n, k)
    return sum(math.comb(k, x) * math.comb(n - k, k - x) for x in range(overlap, k + 1)) / total


def _top(g: pl.DataFrame, k: int) -> list[str]:
    return g.sort(["reduction", "lang"], descending=[True, False])["lang"].to_list()[:k]


def top_kl_rows(rows: pl.DataFrame, baseline: str, english: str = F.ENGLISH) -> list[dict]:
    """For each pair of teachers (per mixer): per seed, the overlap of their top-k languages by KL reduction
    (k = min(8, n // 2) of the n languages both have), as a share of k minus the chance share k / n; mean and
    t-interval over the seeds both teachers ran, expected +. p: the hypergeometric tail of the overlap of the
    seed-mean rankings (two random top-k sets)."""
    red = kl_reductions(rows, baseline, english)
    out = []
    for (mixer,), g in red.sort(["mixer", "teacher"]).group_by(["mixer"], maintain_order=True):
        for a, b in combinations(sorted(g["teacher"].unique().to_list()), 2):
            ga, gb = g.filter(pl.col("teacher") == a), g.filter(pl.col("teacher") == b)
            langs = sorted(set(ga["lang"].to_list()) & set(gb["lang"].to_list()))
            n = len(langs)
            comparison = f"{mixer}: {a} vs {b}"
            seeds = sorted(set(ga["seed"].to_list()) & set(gb["seed"].to_list()))
            if n < 2 or not seeds:
                out.append(_skip(TOP_KL, comparison, +1, "table_kl_reduction",
                                 f"{n} language(s) with KL reductions under both teachers", len(seeds)))
                continue
            k = min(STUDY_TOP_K, n // 2)
            ga, gb = ga.filter(pl.col("lang").is_in(langs)), gb.filter(pl.col("lang").is_in(langs))
            per_seed = []
            for s in seeds:
                ta = _top(ga.filter(pl.col("seed") == s), k)
                tb = _top(gb.filter(pl.col("seed") == s), k)
                per_seed.append(len(set(ta) & set(tb)) / k - k / n)
            ma = ga.group_by("lang").agg(pl.col("reduction").mean())
            mb = gb.group_by("lang").agg(pl.col("reduction").mean())
            ta, tb = _top(ma, k), _top(mb, k)
            shared = len(set(ta) & set(tb))
            e, lo, hi, n_seeds = F._spread(per_seed)
            note = (f"top {k} of {n} languages by seed-mean KL reduction: {a} {ta}, {b} {tb}, {shared} of {k} shared "
                    f"(chance {k * k / n:.2g}; study: the same 8 of 26 for both teachers)")
            out.append(F._row(F.MULTI, TOP_KL, comparison, f"share of the top-{k} KL-reduction languages the two "
                              f"teachers' students share, minus the chance share {k}/{n}", +1, e, lo, hi,
                              "seeds (t-interval)", n_seeds, "hypergeometric tail of the overlap",
                              hypergeometric_tail(shared, n, k), "table_kl_reduction", note,
                              students=F.placement_students(rows, a, mixer) + F.placement_students(rows, b, mixer)))
    return out


def non_latin_rows(rows: pl.DataFrame, baseline: str, english: str = F.ENGLISH) -> list[dict]:
    """Per (teacher, mixer): per seed, mean KL reduction (`kl_reductions`) over non-Latin-script languages minus
    the mean over Latin-script ones (English left out); mean and t-interval over seeds, expected +."""
    red = kl_reductions(rows, baseline, english)
    out = []
    for (teacher, mixer), g in red.sort(["teacher", "mixer"]).group_by(["teacher", "mixer"], maintain_order=True):
        comparison = f"{teacher}/{mixer}: best placement vs {baseline}"
        g = g.with_columns(latin=pl.col("lang").map_elements(is_latin, return_dtype=pl.Boolean))
        n_latin = g.filter(pl.col("latin"))["lang"].n_unique()
        n_other = g.filter(~pl.col("latin"))["lang"].n_unique()
        n_seeds = g["seed"].n_unique()
        if not n_latin or not n_other:
            out.append(_skip(NON_LATIN, comparison, +1, "table_kl_reduction", f"the held-out languages have {n_latin} "
                             f"Latin-script and {n_other} other-script languages besides English; both are needed",
                             n_seeds))
            continue
        per = g.group_by(["seed", "latin"]).agg(pl.col("reduction").mean()).pivot(on="latin", index="seed",
                                                                                  values="reduction")
        per = per.drop_nulls().sort("seed", nulls_last=True)
        d = (per["false"] - per["true"]).to_list()
        e, lo, hi, n = F._spread(d)
        out.append(F._row(F.MULTI, NON_LATIN, comparison, "mean KL reduction (1 - KL(best) / KL(baseline)) over "
                          "non-Latin-script languages minus over Latin-script ones (English excluded)", +1, e, lo, hi,
                          "seeds (t-interval)", n, "sign test over seeds", F._sign_p(d), "table_kl_reduction",
                          f"{n_other} non-Latin and {n_latin} Latin-script languages",
                          students=F.placement_students(rows, teacher, mixer)))
    return out


def reverse_teacher_rows(rows: pl.DataFrame, english: str = F.ENGLISH) -> list[dict]:
    """Reverse periodic against its teacher, per (teacher, mixer), on the held-out rows every model was scored on:
    - gap: pooled CE(reverse periodic, s) - pooled CE(teacher), minus 0.01 nat; t-interval over seeds, expected -;
    - closer: 1 - gap(reverse) / mean gap of the other placements (those run on every seed reverse periodic
      ran), per seed; t-interval over seeds, expected +;
    - lowest: share of non-English languages whose seed-mean CE is lowest for reverse periodic, minus the chance
      share 1 / P (P placements); Clopper-Pearson interval over languages, expected + (the seed rule decides).
    """
    if "reverse_periodic" not in set(rows["placement"].drop_nulls().to_list()):
        return []
    out = []
    teach = _pooled(rows.filter(pl.col("placement").is_null()), ["teacher"], "ce")
    teach_lang = _pooled(rows.filter(pl.col("placement").is_null()), ["teacher", "lang"], "ce")
    stud = rows.filter(pl.col("placement").is_not_null())
    pooled = _pooled(stud, ["teacher", "mixer", "placement", "seed"], "ce")
    by_lang = _pooled(stud.filter(pl.col("lang") != english), ["teacher", "mixer", "placement", "seed", "lang"], "ce")
    for (teacher, mixer), g in pooled.sort(["teacher", "mixer"]).group_by(["teacher", "mixer"], maintain_order=True):
        comparison = f"{teacher}/{mixer}: reverse_periodic vs the teacher"
        t = teach.filter(pl.col("teacher") == teacher)["ce"]
        rev = g.filter(pl.col("placement") == "reverse_periodic").sort("seed")
        if rev.is_empty():
            continue
        if t.is_empty():
            out.append(_skip(REV_GAP, comparison, -1, "perplexity_rows", "the teacher has no held-out rows",
                             rev.height))
            continue
        t_ce = float(t[0])
        gaps = [x - t_ce for x in rev["ce"].to_list()]
        e, lo, hi, n = F._spread([x - STUDY_TEACHER_GAP for x in gaps])
        out.append(F._row(F.MULTI, REV_GAP, comparison, "token-pooled held-out CE, reverse periodic minus the teacher, "
                          "minus 0.01 nat (all languages)", -1, e, lo, hi, "seeds (t-interval)", n,
                          "sign test over seeds", F._sign_p([x - STUDY_TEACHER_GAP for x in gaps]), "perplexity_rows",
                          f"gap to the teacher {float(np.mean(gaps)):.4f} nat (study: within {STUDY_TEACHER_GAP} nat "
                          "of the Granite teacher)", students=((teacher, mixer, "reverse_periodic"),)))
        # the other placements that ran every seed reverse periodic ran (the same set of placements per seed)
        rev_seeds = set(rev["seed"].to_list())
        others = g.filter(pl.col("placement") != "reverse_periodic")
        full = [key[0] for key, h in others.group_by(["placement"]) if rev_seeds <= set(h["seed"].to_list())]
        others = others.filter(pl.col("placement").is_in(full))
        closer = []
        for s, rev_ce in rev.select("seed", "ce").iter_rows():
            o = others.filter(pl.col("seed").is_null() if s is None else pl.col("seed") == s)["ce"].to_list()
            other_gap = float(np.mean(o)) - t_ce if o else math.nan
            if o and other_gap > 0:
                closer.append(1.0 - (rev_ce - t_ce) / other_gap)
        if closer:
            e, lo, hi, n = F._spread(closer)
            vs = F._versus_study(lo, hi, STUDY_CLOSER)
            out.append(F._row(F.MULTI, REV_CLOSER, f"{teacher}/{mixer}: reverse_periodic vs the other placements",
                              "1 - CE gap to the teacher of reverse periodic / mean CE gap of the other placements "
                              "(same seed, all languages)", +1, e, lo, hi, "seeds (t-interval)", n,
                              "sign test over seeds", F._sign_p(closer), "perplexity_rows",
                              f"{F._f(e)} closer (study: {F._f(STUDY_CLOSER)})" + (f"; {vs}" if vs else ""),
                              students=F.placement_students(rows, teacher, mixer, ["reverse_periodic", *sorted(full)])))
        else:
            out.append(_skip(REV_CLOSER, f"{teacher}/{mixer}: reverse_periodic vs the other placements", +1,
                             "perplexity_rows", "no other placement is behind the teacher on a seed reverse periodic "
                             "ran", rev.height))
        lang = (by_lang.filter((pl.col("teacher") == teacher) & (pl.col("mixer") == mixer))
                .group_by(["placement", "lang"]).agg(pl.col("ce").mean()))
        n_place = lang["placement"].n_unique()
        wins = []
        for (lg,), h in lang.sort("lang").group_by(["lang"], maintain_order=True):
            if h.height < n_place:
                continue
            best = h["ce"].min()
            lowest = h.filter(pl.col("ce") == best)["placement"].to_list()
            wins.append(lowest == ["reverse_periodic"])
        if not wins or n_place < 2:
            continue
        k, m = sum(wins), len(wins)
        ci = stats.clopper_pearson_interval(k, m)
        chance = 1.0 / n_place
        k_s, n_s = STUDY_LOWEST
        vs = F._versus_study(ci.lo, ci.hi, k_s / n_s)
        out.append(F._row(F.MULTI, REV_LOWEST, f"{teacher}/{mixer}: reverse_periodic vs {n_place - 1} other placements",
                          f"share of non-English languages whose seed-mean CE is lowest for reverse periodic, minus "
                          f"the chance share 1/{n_place}", +1, ci.estimate - chance, ci.lo - chance, ci.hi - chance,
                          "languages (exact Clopper-Pearson interval of the share)", int(rev.height), "", math.nan,
                          "perplexity_rows", f"lowest in {k} of {m} languages (study: {k_s} of {n_s}, "
                          f"{F._f(k_s / n_s)})" + (f"; {vs}" if vs else ""),
                          students=F.placement_students(rows, teacher, mixer)))
    return out


def multilinguality_rows(rows: pl.DataFrame, softcka: pl.DataFrame, niah: pl.DataFrame,
                         recency: pl.DataFrame | None, fertility: pl.DataFrame | None,
                         softcka_seeds: pl.DataFrame | None = None, baseline: str = "standard_periodic",
                         english: str = F.ENGLISH) -> list[dict]:
    """Every row of this module, in the order of docs/methods.md."""
    return (attn_delta_rows(softcka, softcka_seeds) + swa_rows(softcka) + recency_rows(recency)
            + fertility_rows(fertility, english) + niah_runtime_rows(niah) + top_kl_rows(rows, baseline, english)
            + non_latin_rows(rows, baseline, english) + reverse_teacher_rows(rows, english))


SEARCH_LAYER0 = "the data puts a full-attention layer at layer 0 (searched placement)"
SEARCH_VS = "the searched placement has lower held-out loss than the fixed placements"
LAYER0_SURE = 0.95  # bootstrap frequency at which the choice of layer 0 (or its absence) counts as settled


def searched_rows(importance: pl.DataFrame, rows: pl.DataFrame) -> list[dict]:
    """Rows of the searched placements: layer 0 in the chosen FA set per teacher x mixer x language group, and
    each searched placement against reverse and standard periodic on held-out CE and KL.

    Layer 0: the effect is how often layer 0 is among the chosen layers over the bootstrap of the importance
    sentences (`p_top`); >= 0.95 would be "reproduced", <= 0.05 "contradicted", but the mixers come from ONE
    stage-1 run, so the row stays "inconclusive" (one seed) like every single-seed row. The comparisons use
    `uncertainty.paired_row_comparison` (seed t-interval, paired on the held-out rows), expected sign "-":
    the placement chosen from data is the better one.
    """
    from hybridlab.models.placements import searched_group
    from hybridlab.plots import uncertainty as U

    out = []
    for r in importance.filter(pl.col("layer") == 0).iter_rows(named=True):
        p0 = r["p_top"]
        settled = "yes" if p0 >= LAYER0_SURE else "no" if p0 <= 1 - LAYER0_SURE else "unsettled"
        note = (f"chosen: {'layer 0 in' if r['chosen'] else 'layer 0 not in'} the top {r['n_fa']}; "
                f"{r['n_languages']} languages, {r['n_sentences']} sentences; settled: {settled}; one stage-1 seed")
        out.append(F._row(F.MULTI, SEARCH_LAYER0, f"{r['teacher']}/{r['mixer']}: group {r['group']}",
                          "share of bootstrap replicates (sentences) whose top FA set holds layer 0", +1, p0,
                          math.nan, math.nan, "bootstrap over sentences (a frequency, no interval)", 1, "", math.nan,
                          "layer_importance", note, verdict=stats.INCONCLUSIVE))
    have = rows.filter(pl.col("placement").is_not_null())
    searched = sorted(p for p in have["placement"].unique().to_list() if searched_group(p) is not None)
    for (teacher, mixer), g in have.group_by(["teacher", "mixer"], maintain_order=True):
        for arm in searched:
            a = g.filter(pl.col("placement") == arm)
            for other in ("reverse_periodic", "standard_periodic"):
                b = g.filter(pl.col("placement") == other)
                if a.is_empty() or b.is_empty():
                    continue
                for metric in ("ce", "kl"):
                    c = U.paired_row_comparison(a, b, metric)
                    out.append(F._row(F.MULTI, SEARCH_VS, f"{teacher}/{mixer}: {arm} vs {other} ({metric}, all "
                                      "languages)", f"token-pooled held-out {metric.upper()} difference ({arm} - "
                                      f"{other}), nats", -1, c["effect"], c["effect_lo"], c["effect_hi"],
                                      "seeds (t-interval)", c["n_seeds"], "sign-flip permutation over held-out rows",
                                      c["p_perm"], "perplexity_rows",
                                      students=((teacher, mixer, arm), (teacher, mixer, other))))
    return out
