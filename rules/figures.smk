# Figures phase: one figure or table per result (PDF + PNG, CSV + Markdown), each a named target.

def _runs(table, dirs):
    """Per-run training logs of a figure: {"<table>/seed<N>/<run>": <dir>/metrics.parquet}; make_figure.py
    concatenates them (hybridlab.plots.figures.concat_runs: columns `run` and `seed`)."""
    return {f"{table}/seed{seed}/{run}": f"{d}/metrics.parquet" for run, seed, d in dirs}


_EV = lambda name: R("eval", f"{name}.parquet")
_DISTILL_RUNS = _runs("distill", [(f"{t}/{p}-{m}", s, distill_dir(t, p, m, "stage2", s))
                                  for t, p, m in STUDENTS for s in DISTILL_SEEDS])
_SR_RUNS = _runs("bld_sr", [(a, s, bld_sr_dir(a, s)) for a in bld_sr_arms() for s in SR_SEEDS])
_NL_RUNS = _runs("bld_nl", [(a, s, bld_nl_dir(a, s)) for a in bld_nl_arms() for s in NL_SEEDS])

# figure -> {table name (hybridlab.plots.figures.FIGURES) : parquet path}; one named target rule each.
FIGURES = {
    "fig_placements": {"softcka": _EV("softcka")},
    "fig_softcka_pairs": {"softcka": _EV("softcka")},
    "fig_softcka_attn_delta": {"softcka": _EV("softcka")},
    "fig_recency": {"recency": _EV("recency")},
    "fig_fertility": {"fertility": _EV("fertility")},
    "fig_niah": {"niah": _EV("niah")},
    "fig_distill_curves": _DISTILL_RUNS,
    "fig_tokens_to_baseline": {"tokens_to_baseline": _EV("tokens_to_baseline")},
    "fig_sr_accuracy": _SR_RUNS,
    "fig_sr_grad_norms": _SR_RUNS,
    "fig_sr_longgap": _SR_RUNS,
    "fig_retrieval_score": {"retrieval_score": _EV("retrieval_score")},
    "fig_bld_nl_loss": _NL_RUNS,
    "fig_position_loss": {"position_loss": _EV("position_loss")},
    "fig_retrieval_heads": {"retrieval_heads": _EV("retrieval_heads"),
                            "retrieval_heads_masking": _EV("retrieval_heads_masking")},
}
# table -> its inputs, written as CSV + Markdown
TABLES = {
    "table_perplexity": {"perplexity": _EV("perplexity")},
    "table_kl_reduction": {"perplexity": _EV("perplexity")},
    "table_softcka_first_fa": {"softcka": _EV("softcka")},
    "table_bld_nl": {**_NL_RUNS, "position_loss_summary": _EV("position_loss_summary")},
    "table_placement_tests": {"perplexity_rows": _EV("perplexity_rows")},
    "table_tokens_to_target": _DISTILL_RUNS,
    "table_retrieval_score": {"retrieval_score": _EV("retrieval_score")},
    "table_sr_accuracy": _SR_RUNS,
    # the generated findings table (hybridlab.plots.findings): every finding with effect, CI and verdict
    "table_findings": {"perplexity_rows": _EV("perplexity_rows"), "softcka": _EV("softcka"), "niah": _EV("niah"),
                       "retrieval_score": _EV("retrieval_score"), **_DISTILL_RUNS, **_SR_RUNS, **_NL_RUNS},
}
if PAPER_PATH:  # lm-eval runs at the paper and rehearsal presets only (rules/eval.smk)
    TABLES["table_lm_benchmarks"] = {"lm_benchmarks": _EV("lm_benchmarks")}

# The Snakemake report (`snakemake --report`): every figure and table with the caption from
# hybridlab.plots.figures.CAPTIONS, the preset and the config hash (report/caption.rst), by study.
from hybridlab.plots.figures import CAPTIONS

_BLD = ("fig_sr_", "fig_retrieval_score", "fig_bld_nl", "fig_position_loss", "fig_retrieval_heads", "table_bld_nl",
        "table_lm_benchmarks", "table_retrieval_score", "table_sr_accuracy")
_STAMP = {"preset": SCALE, "config_hash": CONFIG_HASH}


def _study(name):
    if name == "table_findings":
        return "Findings (generated)"
    return "Competing learning (BLD)" if name.startswith(_BLD) else "Multilinguality"


def _in_report(path, kind):
    """Mark an output for the report: category = study, caption from CAPTIONS (wildcard `kind`)."""
    return report(path, caption="../report/caption.rst", category=lambda wc: _study(wc[kind]),
                  labels=lambda wc: {"name": wc[kind], "preset": SCALE})


def _table_args(tables):
    return [f"{name}={path}" for name, path in tables.items()]


rule figure:
    """Render one figure (PNG + PDF, byte-stable) from its eval tables / training logs (hybridlab.plots)."""
    input:
        lambda wc: list(FIGURES[wc.fig].values()),
    output:
        png=_in_report(R("figures", "{fig}.png"), "fig"),
        pdf=R("figures", "{fig}.pdf"),
    wildcard_constraints:
        fig="|".join(FIGURES),
    params:
        cfg=as_json(_STAMP),
        caption=lambda wc: CAPTIONS[wc.fig],
        **_STAMP,
        tables=lambda wc: _table_args(FIGURES[wc.fig]),
    threads: 1
    log:
        LOG("figures", "{fig}"),
    benchmark:
        BENCH("figures", "{fig}")
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/make_figure.py --params {params.cfg:q} --fig {wildcards.fig} --tables {params.tables:q} "
        "--out-png {output.png} --out-pdf {output.pdf} > {log} 2>&1"


rule table:
    """Write one results table as CSV + Markdown (hybridlab.plots.figures TABLES)."""
    input:
        lambda wc: list(TABLES[wc.table].values()),
    output:
        csv=_in_report(R("figures", "{table}.csv"), "table"),
        md=R("figures", "{table}.md"),
    wildcard_constraints:
        table="|".join(TABLES),
    params:
        cfg=as_json({**_STAMP, "baseline_placement": C["experiments"]["distill"]["baseline_placement"]}),
        caption=lambda wc: CAPTIONS[wc.table],
        **_STAMP,
        tables=lambda wc: _table_args(TABLES[wc.table]),
    threads: 1
    log:
        LOG("figures", "{table}"),
    benchmark:
        BENCH("figures", "{table}")
    resources:
        mem_mb=2000,
        runtime=10,
        gpu=0,
    conda:
        CPU_ENV
    shell:
        "{PY} workflow_scripts/make_figure.py --params {params.cfg:q} --fig {wildcards.table} "
        "--tables {params.tables:q} --out-csv {output.csv} --out-md {output.md} > {log} 2>&1"


for _fig in FIGURES:

    rule:
        name:
            _fig
        input:
            R("figures", f"{_fig}.png"),
            R("figures", f"{_fig}.pdf"),


for _table in TABLES:

    rule:
        name:
            _table
        input:
            R("figures", f"{_table}.csv"),
            R("figures", f"{_table}.md"),


rule figures:
    """Phase target: every figure."""
    input:
        [R("figures", f"{f}.{ext}") for f in FIGURES for ext in ("png", "pdf")],
        [R("figures", f"{t}.{ext}") for t in TABLES for ext in ("csv", "md")],
