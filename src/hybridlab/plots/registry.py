"""The registry of the report's figures and tables: which exist (`FIGURES`, `TABLES`), the input tables each
reads, their captions (`CAPTIONS`), and how the figures rules read those inputs and render one output.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.plots import findings as _findings
from hybridlab.plots import results_page as _results_page
from hybridlab.plots.figures import (bld_nl_loss, distill_curves, fertility, layer_importance, niah, placements,
                                     position_loss, recency, retrieval_heads, retrieval_score, softcka_pairs,
                                     sr_accuracy, sr_grad_norms, sr_longgap, tokens_to_baseline)
from hybridlab.plots.tables import (bld_nl_table, concat_runs, kl_reduction_table, lm_benchmarks_table,
                                    perplexity_table, softcka_first_fa_table, write_table)
from hybridlab.plots.uncertainty import (placement_tests_table, retrieval_score_table, sr_accuracy_table,
                                         tokens_to_target_table)

# One-paragraph captions for the Snakemake report (the rule adds the preset and the config hash).
CAPTIONS = {
    "fig_placements": "Layer types of every analysed model: full attention (FA) vs the recurrent mixer, per "
                      "decoder layer, for the dense teacher and each converted hybrid.",
    "fig_softcka_pairs": "English vs each language's parallel sentences, per layer (hidden states; layer 0 = "
                         "embeddings). Top: the pair alignment, the centred cosine of each translation pair "
                         "with each language's own mean removed (the headline; higher = the pairs sit together); "
                         "middle: the language offset, how far apart the two languages' means lie relative to "
                         "the spread within a language (higher = the languages are more separated); bottom: "
                         "the sentence-set SoftCKA (a second view). Solid = hybrid, dashed = its dense partner; "
                         "the hybrid's FA layers are shaded. Bands: 95 % bootstrap over sentences.",
    "fig_softcka_attn_delta": "The same for each mixer / attention block's residual contribution (attn_delta), "
                              "per decoder layer: pair alignment (top), language offset (middle) and sentence-set "
                              "SoftCKA (bottom, second view); "
                              "hybrid FA layers shaded. Bands: 95 % bootstrap over sentences.",
    "fig_recency": "Attention recency of the full-attention layers, hybrid vs dense: mean attention distance "
                   "per FA layer (top) and attention mass on the last w tokens vs w (bottom), means over heads and "
                   "languages. Error bars (top) and bands (bottom): 95 % percentile bootstrap over the input "
                   "sequences, computed per head and averaged over the same heads (a typical head's interval).",
    "fig_fertility": "Tokenizer fertility: tokens per sentence relative to English on the parallel set, per "
                     "language and tokenizer. Error bars: 95 % bootstrap over sentence pairs.",
    "fig_layer_importance": "Layer importance by language group: the token-mean KL(teacher || teacher with only that "
                            "layer's attention replaced by its stage-1 mixer), mean over the group's languages, on "
                            "parallel sentences the held-out rows do not use. Dots: the searched placement's "
                            "full-attention layers (the group's highest scores); numbers: how often the layer is "
                            "among them over a bootstrap of the sentences.",
    "fig_niah": "Multilingual needle-in-a-haystack: accuracy (mean over the OneRULER-style tasks) and seconds "
                "per example vs context length (in the model's tokens), hybrid vs dense; OOM cells marked. Error bars: 95 % Wilson intervals over each cell's examples.",
    "fig_distill_curves": "Distillation stage 2: held-out cross-entropy and KL(teacher || student) vs "
                          "training tokens, one line per full-attention placement. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_tokens_to_baseline": "Tokens each placement needs to reach the standard-periodic arm's final loss, "
                              "as a fraction of the standard-periodic arm's tokens (lower = faster). Bars: mean over seeds; error bars: 95 % t-interval across seeds.",
    "fig_sr_accuracy": "Spaced Retrieval: validation answer accuracy vs step per gap, one line per BLD arm "
                       "(baseline, freezes of the recurrent layers, long-gap sweep). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_sr_grad_norms": "Spaced Retrieval: gradient norm of attention and recurrent layers vs step, per arm "
                         "(frozen steps are not drawn). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_sr_longgap": "Spaced Retrieval long-gap sweep: final validation accuracy per gap vs the fraction of "
                      "long-gap examples in training. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_retrieval_score": "Layer Retrieval Ability Score by activation patching, per layer, over training "
                           "(baseline, arms freezing the recurrent layers before or after the takeover, long-gap "
                           "sweep). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_bld_nl_loss": "BLD on natural language: training loss and held-out CE vs tokens; colour = mixer, "
                       "solid = BLD (recurrent layers frozen early), dashed = baseline. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_position_loss": "Mean loss by token-position bucket on long documents, BLD vs baseline per mixer. "
                         "Bands: 95 % percentile bootstrap over the documents (evaluation windows) of each "
                         "bucket's token-mean loss.",
    "fig_retrieval_heads": "Retrieval heads (DuoAttention-style gates): alpha per KV head of the attention "
                           "layers (left) and passkey accuracy as heads are masked, lowest alpha first (right). Error bars: 95 % Wilson intervals over the passkey examples.",
    "table_perplexity": "Per-language perplexity of the teacher and of every placement's student, the best "
                        "placement per language and its relative change vs standard periodic.",
    "table_kl_reduction": "Languages ranked by the KL reduction of their best placement vs standard periodic "
                          "(1 - KL(best) / KL(standard periodic)).",
    "table_softcka_first_fa": "Pair alignment (the headline), language offset and sentence-set SoftCKA (a second view) "
                              "just before and after each hybrid's first full-attention layer, for the hybrid "
                              "and its dense partner at the same depth (the change at the first FA layer).",
    "table_lm_benchmarks": "Standard benchmarks (lm-eval; paper preset): one row per model (teachers, "
                           "distilled students, BLD arms), one column per task and metric.",
    "table_bld_nl": "BLD on natural language per arm: final held-out CE (mean over seeds, t-interval across "
                    "seeds), its paired change vs the baseline arm with its interval and sign test, long-document "
                    "perplexity and LongPPL (first seed).",
    "table_placement_tests": "Each placement vs standard periodic per language (and pooled): token-pooled CE / KL "
                             "difference with its t-interval across seeds and its bootstrap CI over held-out rows, "
                             "paired permutation and sign tests over rows, and the verdict.",
    "table_kl_gaps": "Held-out KL to the teacher (and CE) of every distilled student at conversion, after stage 1 and "
                     "after stage 2, per seed; past_baseline_final marks a stage-2 start already at or below the "
                     "standard-periodic baseline's final CE.",
    "table_tokens_to_target": "Tokens to target on stage-2 tokens (curves read over both stages, stage 1 taken "
                              "apart): the fraction of standard periodic's stage-2 tokens each placement needs to "
                              "reach 50 / 80 / 90 / 100 % of the baseline's smoothed improvement, mean over the "
                              "seeds that reached it; seeds already past a target at stage 2's start or never "
                              "reaching it are censored (counted, with their bound; no interval then).",
    "table_retrieval_score": "Final Layer Retrieval Ability Score per BLD-SR arm and layer (mean over gaps): mean "
                             "and t-interval across seeds.",
    "table_sr_accuracy": "Final Spaced Retrieval validation accuracy per BLD-SR arm and gap: mean and t-interval "
                         "across seeds (clipped to [0, 1]).",
    "table_findings": "Generated findings table: each finding of both studies, computed from the tables above, "
                      "with its effect, 95 % interval (over seeds, or over evaluation units of one seed) and verdict "
                      "(reproduced / contradicted / inconclusive at this scale; docs/methods.md \"Findings table\" gives the rules).",
}


# name -> (function, the table names it reads, in argument order)
FIGURES = {
    "fig_placements": (placements, ["softcka"]),
    "fig_softcka_pairs": (lambda t: softcka_pairs(t, "hidden"), ["softcka"]),
    "fig_softcka_attn_delta": (lambda t: softcka_pairs(t, "attn_delta"), ["softcka"]),
    "fig_recency": (recency, ["recency"]),
    "fig_fertility": (fertility, ["fertility"]),
    "fig_niah": (niah, ["niah"]),
    "fig_layer_importance": (layer_importance, ["layer_importance"]),
    "fig_distill_curves": (distill_curves, ["distill"]),
    "fig_tokens_to_baseline": (tokens_to_baseline, ["tokens_to_baseline"]),
    "fig_sr_accuracy": (sr_accuracy, ["bld_sr"]),
    "fig_sr_grad_norms": (sr_grad_norms, ["bld_sr"]),
    "fig_sr_longgap": (sr_longgap, ["bld_sr"]),
    "fig_retrieval_score": (retrieval_score, ["retrieval_score"]),
    "fig_bld_nl_loss": (bld_nl_loss, ["bld_nl"]),
    "fig_position_loss": (position_loss, ["position_loss"]),
    "fig_retrieval_heads": (retrieval_heads, ["retrieval_heads", "retrieval_heads_masking"]),
}

RUN_TABLES = ("distill", "distill_stage1", "bld_sr", "bld_nl", "softcka_seeds")  # one metrics file per run: `<table>/<run>=path`

# Inputs a table reads when they exist (a preset without the BLD study has none of the BLD tables).
OPTIONAL_INPUTS = {"table_findings": ("retrieval_score", "bld_sr", "bld_nl", "softcka_seeds", "recency", "fertility",
                                      "position_loss_summary", "position_loss", "retrieval_heads_masking",
                                      "lm_benchmarks", "layer_importance")}

# table_findings' keyword-only inputs, in the order of its input list after softcka_seeds
_FINDINGS_KEYWORDS = ("recency", "fertility", "position_loss_summary", "position_loss", "retrieval_heads_masking",
                      "lm_benchmarks", "layer_importance")

TABLES = {
    "table_perplexity": (perplexity_table, ["perplexity"]),
    "table_kl_reduction": (kl_reduction_table, ["perplexity"]),
    "table_softcka_first_fa": (softcka_first_fa_table, ["softcka"]),
    "table_bld_nl": (bld_nl_table, ["bld_nl", "position_loss_summary"]),
    "table_lm_benchmarks": (lm_benchmarks_table, ["lm_benchmarks"]),  # paper preset only
    "table_placement_tests": (placement_tests_table, ["perplexity_rows"]),
    "table_tokens_to_target": (tokens_to_target_table, ["distill", "distill_stage1"]),
    "table_retrieval_score": (retrieval_score_table, ["retrieval_score"]),
    "table_sr_accuracy": (sr_accuracy_table, ["bld_sr"]),
    "table_kl_gaps": (lambda *a, **k: _results_page.kl_gap_table(*a, **k), ["distill", "distill_stage1"]),
    # the tables after softcka_seeds are findings_table's keyword arguments
    "table_findings": (lambda *a, **k: _findings.findings_table(
        *a[:9], **dict(zip(_FINDINGS_KEYWORDS, a[9:])), **k),
                       ["perplexity_rows", "distill", "softcka", "niah", "retrieval_score", "bld_sr", "bld_nl",
                        "distill_stage1", "softcka_seeds", *_FINDINGS_KEYWORDS]),
}
# the signature of the function behind a TABLES lambda: render_table passes it only the keywords it accepts
_TABLE_SIGNATURES = {"table_findings": _findings.findings_table, "table_kl_gaps": _results_page.kl_gap_table}


def render(name: str, tables: dict[str, pl.DataFrame]):
    """The Figure `name` of FIGURES drawn from `tables` (table name -> DataFrame)."""
    if name not in FIGURES:
        raise HybridlabError(f"unknown figure '{name}'; choose one of {sorted(FIGURES)}")
    fn, needs = FIGURES[name]
    missing = [t for t in needs if t not in tables]
    if missing:
        raise HybridlabError(f"figure '{name}' needs tables {missing}; pass them as --tables NAME=PATH")
    return fn(*[tables[t] for t in needs])


def render_table(name: str, tables: dict[str, pl.DataFrame], **kwargs) -> pl.DataFrame:
    """The table `name` of TABLES built from `tables`."""
    if name not in TABLES:
        raise HybridlabError(f"unknown table '{name}'; choose one of {sorted(TABLES)}")
    fn, needs = TABLES[name]
    missing = [t for t in needs if t not in tables and t not in OPTIONAL_INPUTS.get(name, ())]
    if missing:
        raise HybridlabError(f"table '{name}' needs tables {missing}; pass them as --tables NAME=PATH")
    accepted = inspect.signature(_TABLE_SIGNATURES.get(name, fn)).parameters
    return fn(*[tables.get(t) for t in needs], **{k: v for k, v in kwargs.items() if k in accepted})


# --- the figure and table outputs of the figures rules --------------------------------------------

def read_tables(items: list[str]) -> dict[str, pl.DataFrame]:
    """`NAME=PATH` / `NAME/RUN=PATH` items (make_figure.py's --tables) -> {table: DataFrame}.

    NAME=PATH reads one parquet table; NAME/RUN=PATH, NAME one of RUN_TABLES, reads one training log per
    run, and the runs of NAME are concatenated into one table with a `run` column (`concat_runs`). A damaged
    file (truncated, hand-edited, not parquet) raises one line naming it and how to rebuild it."""
    from hybridlab.atomic import rebuild_hint

    def _read_parquet(path: str, name: str) -> pl.DataFrame:
        try:
            return pl.read_parquet(path)
        except Exception as exc:  # polars raises several kinds (ComputeError, OSError, ...) for a bad file
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise HybridlabError(f"table file {path} (for '{name}') is damaged or not a parquet table ({reason}); "
                                 f"{rebuild_hint(path)}") from exc

    plain, runs = {}, {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise HybridlabError(f"--tables item '{item}' is not NAME=PATH")
        if not Path(path).is_file():
            raise HybridlabError(f"table file {path} (for '{name}') does not exist; build its rule first")
        table, slash, run = name.partition("/")
        if slash:
            if table not in RUN_TABLES:
                raise HybridlabError(f"'{name}': only {list(RUN_TABLES)} take per-run files (NAME/RUN=PATH)")
            runs.setdefault(table, {})[run] = _read_parquet(path, name)
        else:
            if name in plain:
                raise HybridlabError(f"table '{name}' given twice in --tables")
            plain[name] = _read_parquet(path, name)
    for table, frames in runs.items():
        plain[table] = concat_runs(frames)
    return plain


def render_outputs(name: str, tables: dict[str, pl.DataFrame], params: "FigureJob | dict | None" = None, *,
                   out_png=None, out_pdf=None, out_csv=None, out_md=None) -> str:
    """Render the figure (PNG + PDF, byte-stable: `hybridlab.plots.style.save_all`) or the table (CSV +
    Markdown: `write_table`) `name` from `tables`; returns a one-line report. A table takes the section's
    `baseline_placement` (`hybridlab.config_spec.FigureJob`, or its dict) as its `baseline` when it has that
    parameter."""
    from hybridlab.config_spec import FigureJob, job_settings
    from hybridlab.config_spec.fields import UNSET

    job = job_settings(FigureJob, params or {}, "make_figure.py")
    if name in TABLES:
        if not (out_csv and out_md):
            raise HybridlabError(f"table '{name}' needs --out-csv and --out-md")
        kwargs = {"baseline": job.baseline_placement} if job.baseline_placement else {}
        if job.converged_kl is not UNSET:
            kwargs["kl_limit"] = job.converged_kl
        df = render_table(name, tables, **kwargs)
        write_table(df, out_csv, out_md)
        return f"{name}: {df.height} rows -> {out_csv}, {out_md}"
    if not (out_png and out_pdf):
        raise HybridlabError(f"figure '{name}' needs --out-png and --out-pdf")
    from hybridlab.plots.style import save_all

    save_all(render(name, tables), out_png, out_pdf)
    return f"{name} -> {out_png}, {out_pdf}"

