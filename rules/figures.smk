# Figures phase: one figure or table per result (PDF + PNG, CSV + Markdown), each a named target.

FIGURES = {
    "fig_placements": ["softcka"],
    "fig_softcka_pairs": ["softcka"],
    "fig_recency": ["recency"],
    "fig_fertility": ["fertility"],
    "fig_niah": ["niah"],
    "fig_distill_curves": ["perplexity"],
    "fig_spaced_retrieval": ["retrieval_score"],
    "fig_bld_nl": ["position_loss", "retrieval_heads"],
}


rule figure:
    """Render one figure from its eval tables."""
    input:
        lambda wc: [R("eval", f"{t}.parquet") for t in FIGURES[wc.fig]],
    output:
        png=R("figures", "{fig}.png"),
        pdf=R("figures", "{fig}.pdf"),
    wildcard_constraints:
        fig="|".join(FIGURES),
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
        "{NOT_READY} figure:{wildcards.fig} 'figure rendering' 6 > {log} 2>&1"


for _fig in FIGURES:

    rule:
        name:
            _fig
        input:
            R("figures", f"{_fig}.png"),
            R("figures", f"{_fig}.pdf"),


rule figures:
    """Phase target: every figure."""
    input:
        [R("figures", f"{f}.{ext}") for f in FIGURES for ext in ("png", "pdf")],
