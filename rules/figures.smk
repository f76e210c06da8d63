# Figures phase: one figure or table per result (PDF + PNG, CSV + Markdown), each a named target.


rule figure:
    """Render one figure (PNG + PDF, byte-stable) from its eval tables / training logs (hybridlab.plots)."""
    input:
        lambda wc: list(FIGURES[wc.fig].values()),
    output:
        png=_in_report(R("figures", "{fig}.png"), "fig"),
        pdf=R("figures", "{fig}.pdf"),
    log:
        LOG("figures", "{fig}"),
    benchmark:
        BENCH("figures", "{fig}")
    wildcard_constraints:
        fig="|".join(FIGURES),
    priority: PRIORITY["figures"]
    conda:
        CPU_ENV
    threads: 1
    resources:
        **job_resources("figure"),
    params:
        **_STAMP,
        cfg=as_json(_STAMP),
        caption=lambda wc: CAPTIONS[wc.fig],
        tables=lambda wc: _table_args(FIGURES[wc.fig]),
    shell:
        "python workflow_scripts/make_figure.py --params {params.cfg:q} --fig {wildcards.fig} --tables {params.tables:q} "
        "--out-png {output.png} --out-pdf {output.pdf} > {log} 2>&1"


rule table:
    """Write one results table as CSV + Markdown (hybridlab.plots.registry TABLES)."""
    input:
        lambda wc: list(TABLES[wc.table].values()),
    output:
        csv=_in_report(R("figures", "{table}.csv"), "table"),
        md=R("figures", "{table}.md"),
    log:
        LOG("figures", "{table}"),
    benchmark:
        BENCH("figures", "{table}")
    wildcard_constraints:
        table="|".join(TABLES),
    priority: PRIORITY["figures"]
    conda:
        CPU_ENV
    threads: 1
    resources:
        **job_resources("table"),
    params:
        **_STAMP,
        cfg=as_json(
            {
                **_STAMP,
                "baseline_placement": C["experiments"]["distill"]["baseline_placement"],
                "converged_kl": C["experiments"]["distill"]["converged_kl"],
            }
        ),
        caption=lambda wc: CAPTIONS[wc.table],
        tables=lambda wc: _table_args(TABLES[wc.table]),
    shell:
        "python workflow_scripts/make_figure.py --params {params.cfg:q} --fig {wildcards.table} "
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


rule results_page:
    """The build's results page: findings next to the study's numbers, distance to the teacher by stage, job times."""
    input:
        findings=R("figures", "table_findings.csv"),
        gaps=R("figures", "table_kl_gaps.csv"),
        softcka=R("eval", "softcka.parquet"),
    output:
        R("figures", "results.md"),
    log:
        LOG("figures", "results_page"),
    priority: PRIORITY["figures"]
    conda:
        CPU_ENV
    threads: 1
    resources:
        **job_resources("results_page"),
    params:
        cfg=as_json(
            {
                "preset": SCALE,
                "header": RESULTS_HEADER,
                "converged_kl": C["experiments"]["distill"]["converged_kl"],
            }
        ),
        benchmarks=[R(phase, "benchmarks") for phase in ("data", "models", "train", "eval")],
    shell:
        "python workflow_scripts/make_results_page.py --params {params.cfg:q} --findings {input.findings} "
        "--gaps {input.gaps} --softcka {input.softcka} --benchmarks {params.benchmarks} --out {output} > {log} 2>&1"


rule figures:
    """Phase target: every figure, every table and the results page."""
    input:
        [R("figures", f"{f}.{ext}") for f in FIGURES for ext in ("png", "pdf")],
        [R("figures", f"{t}.{ext}") for t in TABLES for ext in ("csv", "md")],
        R("figures", "results.md"),
