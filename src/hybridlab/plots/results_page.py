"""The results page of a build: each multilinguality finding next to the study's number, and how far the
students are from their teacher at each distillation stage.

Two pieces:

* `kl_gap_table(distill, distill_stage1)`: per placement and seed, the held-out KL to the teacher (and CE)
  at conversion (stage 1's evaluation before its first update), after stage 1 (its last evaluation) and
  after stage 2 (stage 2's last), with the stage-2 start flagged when it is already at or below the
  standard-periodic baseline's final CE: then "tokens to the baseline's loss" measures conversion and
  stage 1, not stage 2.
* `alignment_summary(softcka)`: per analysed model (the teacher and every student of the first seed), the
  hidden-state pair alignment, language offset, pooled-centring alignment and sentence-set CKA, each the
  mean over layers and languages, and the layer where the pair alignment peaks.
* `results_markdown(...)`: a Markdown page from the findings table, the KL-gap table, the alignment summary,
  the job times (Snakemake's benchmark files) and the preset's name; written by the `results_page` rule.

The study's numbers are the published ones (FA-first placements reach the baseline's final loss with about
40 % of its tokens; reverse periodic within 0.01 nat of its teacher and about 10 % closer than the other
placements; 23 of 26 languages improved); a CPU budget of tens of thousands of tokens is a different regime
from the study's billion, and the page says so.
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from hybridlab.errors import HybridlabError

STAGES = ("conversion", "stage1", "stage2")
GAP_SCHEMA = {"teacher": pl.String, "placement": pl.String, "seed": pl.Int64, "stage": pl.String,
              "tokens": pl.Int64, "kl": pl.Float64, "ce": pl.Float64, "past_baseline_final": pl.Boolean}


def _split_run(run: str) -> tuple[str, str]:
    """`<teacher>/<placement>-<mixer>` -> (teacher, placement-mixer)."""
    teacher, _, student = run.rpartition("/")
    return teacher, student


def _evals(df: pl.DataFrame) -> pl.DataFrame:
    need = {"run", "seed", "tokens", "eval/kl", "eval/ce"}
    missing = need - set(df.columns)
    if missing:
        raise HybridlabError(f"distillation metrics lack columns {sorted(missing)}; rebuild the distill rules")
    return df.filter(pl.col("eval/kl").is_not_null()).sort(["run", "seed", "tokens"])


def kl_gap_table(distill: pl.DataFrame, distill_stage1: pl.DataFrame,
                 baseline: str = "standard_periodic") -> pl.DataFrame:
    """Held-out KL / CE to the teacher at conversion, after stage 1 and after stage 2 (see module docstring)."""
    s1, s2 = _evals(distill_stage1), _evals(distill)
    rows = []
    for (run, seed), g in s1.group_by(["run", "seed"], maintain_order=True):
        teacher, student = _split_run(run)
        first, last = g.row(0, named=True), g.row(-1, named=True)
        rows.append((teacher, student, seed, "conversion", first["tokens"], first["eval/kl"], first["eval/ce"]))
        rows.append((teacher, student, seed, "stage1", last["tokens"], last["eval/kl"], last["eval/ce"]))
    base_final = {}
    for (run, seed), g in s2.group_by(["run", "seed"], maintain_order=True):
        teacher, student = _split_run(run)
        last = g.row(-1, named=True)
        rows.append((teacher, student, seed, "stage2", last["tokens"], last["eval/kl"], last["eval/ce"]))
        if student.startswith(baseline + "-"):
            base_final[(teacher, student.removeprefix(baseline + "-"), seed)] = last["eval/ce"]
    starts = {}
    for (run, seed), g in s2.group_by(["run", "seed"], maintain_order=True):
        teacher, student = _split_run(run)
        starts[(teacher, student, seed)] = g.row(0, named=True)["eval/ce"]
    out = []
    for teacher, student, seed, stage, tokens, kl, ce in rows:
        mixer = student.rpartition("-")[2]
        target = base_final.get((teacher, mixer, seed))
        start = starts.get((teacher, student, seed))
        past = None if target is None or start is None else bool(start <= target)
        out.append({"teacher": teacher, "placement": student, "seed": seed, "stage": stage, "tokens": tokens,
                    "kl": kl, "ce": ce, "past_baseline_final": past if stage == "stage2" else None})
    order = {s: i for i, s in enumerate(STAGES)}
    return (pl.DataFrame(out, schema=GAP_SCHEMA)
            .with_columns(pl.col("stage").replace_strict(order, return_dtype=pl.Int64).alias("_o"))
            .sort(["teacher", "placement", "seed", "_o"]).drop("_o"))


ALIGNMENT_COLUMNS = ("alignment", "language_offset", "alignment_pooled", "cka")


def alignment_summary(softcka: pl.DataFrame) -> pl.DataFrame:
    """One row per analysed model (hidden states): the mean over layers and languages of each alignment
    quantity the table has (`ALIGNMENT_COLUMNS`), and `peak_layer` / `peak_alignment`, the hidden row whose
    language-mean pair alignment is highest. A model listed in several pairs (the teacher) appears once."""
    need = {"model", "role", "kind", "layer", "lang", "alignment"}
    missing = need - set(softcka.columns)
    if missing:
        raise HybridlabError(f"the SoftCKA table lacks columns {sorted(missing)}; rebuild it with `make all`")
    cols = [c for c in ALIGNMENT_COLUMNS if c in softcka.columns]
    hid = softcka.filter(pl.col("kind") == "hidden").unique(["model", "layer", "lang"], keep="first",
                                                            maintain_order=True)
    per_layer = hid.group_by(["model", "role", "layer"]).agg(pl.col(c).mean() for c in cols)
    peak = (per_layer.sort(["alignment", "layer"], descending=[True, False]).group_by("model", maintain_order=True)
            .first().select("model", peak_layer="layer", peak_alignment="alignment"))
    mean = per_layer.group_by(["model", "role"]).agg(pl.col(c).mean() for c in cols)
    return mean.join(peak, on="model").sort(["role", "model"], descending=[False, False])


def _fmt(x, digits=3) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{digits}f}"


def _md(df: pl.DataFrame) -> str:
    cols = df.columns
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.iter_rows():
        lines.append("| " + " | ".join(_fmt(v) if isinstance(v, float) else ("" if v is None else str(v))
                                       for v in r) + " |")
    return "\n".join(lines)


def job_times(bench_files: list[str | Path]) -> pl.DataFrame:
    """Wall seconds per job from Snakemake benchmark files (`<phase>/benchmarks/<job>.tsv`), longest first."""
    rows = []
    for f in bench_files:
        f = Path(f)
        df = pl.read_csv(f, separator="\t")
        parts = f.parts
        phase = parts[parts.index("benchmarks") - 2] if "benchmarks" in parts[2:] else ""
        rows.append({"job": f.stem, "phase": phase, "seconds": float(df["s"][0])})
    if not rows:
        return pl.DataFrame(schema={"job": pl.String, "phase": pl.String, "seconds": pl.Float64})
    return pl.DataFrame(rows).sort("seconds", descending=True)


def results_markdown(findings: pl.DataFrame, gaps: pl.DataFrame, times: pl.DataFrame, *, scale: str,
                     header: str = "", alignment: pl.DataFrame | None = None, kl_limit: float | None = None) -> str:
    """The results page (see module docstring); `alignment` is `alignment_summary`'s table, `kl_limit` the
    preset's converged_kl."""
    from hybridlab.plots.findings import narrow_markdown
    summary = (gaps.group_by(["placement", "stage"], maintain_order=True)
               .agg(pl.len().alias("seeds"), pl.col("kl").mean().alias("kl_mean"), pl.col("kl").min().alias("kl_min"),
                    pl.col("kl").max().alias("kl_max"), pl.col("ce").mean().alias("ce_mean")))
    past = gaps.filter(pl.col("stage") == "stage2", pl.col("past_baseline_final").fill_null(False),
                       ~pl.col("placement").str.starts_with("standard_periodic"))
    parts = [f"# Results of the `{scale}` build", ""]
    if header:
        parts += [header.strip(), ""]
    gate = ""
    if kl_limit is not None:
        stage2 = gaps.filter(pl.col("stage") == "stage2")
        over = stage2.group_by("placement").agg(pl.col("kl").mean()).filter(pl.col("kl") > kl_limit)
        gate = (f" A row about the distilled students is decided only when each of them ends within {kl_limit:g} nat "
                f"of held-out KL of its teacher; {over.height} of {stage2['placement'].n_unique()} students are "
                "not at stage 2's last curve evaluation (the table below), so their rows read \"students not "
                "converged\" (the findings read the KL of the held-out table, `students_kl`).")
    parts += ["## Findings next to the study", "",
              "Verdicts follow docs/methods.md \"Findings table\": a row is reproduced or contradicted only when "
              "its interval decides it; censored or one-seed rows are inconclusive." + gate, "",
              narrow_markdown(findings, "multilinguality"),
              "## Distance to the teacher by stage", "",
              "Held-out KL(teacher || student) and CE (nats per token) on the held-out rows used for the curves: "
              "at conversion (before any update), after stage 1 and after stage 2; mean, min and max over seeds.",
              "", _md(summary), ""]
    if past.height:
        names = ", ".join(sorted({f"{r['placement']} (seed {r['seed']})" for r in past.iter_rows(named=True)}))
        parts += [f"**Already past the baseline at stage 2's start:** {names} start stage 2 at or below the "
                  "standard-periodic baseline's final held-out CE. For them, tokens to the baseline's loss is a "
                  "finding about conversion and stage 1, not about stage 2.", ""]
    if alignment is not None and alignment.height:
        parts += ["## Cross-lingual alignment by model", "",
                  "Hidden states, English against each language, mean over layers and languages (first seed's "
                  "models). `alignment`: the pair alignment, each translation pair's centred cosine with each "
                  "language's own mean embedding removed (the headline); `language_offset`: the distance between "
                  "the two languages' mean embeddings over the spread within a language; `alignment_pooled`: the "
                  "cosine with one centring over both languages (dominated by the offset); `cka`: the sentence-set "
                  "SoftCKA. `peak_layer`: the hidden row where the pair alignment is highest. Definitions: "
                  "docs/methods.md \"SoftCKA and pair alignment\".", "", _md(alignment), ""]
    if times.height:
        total = float(times["seconds"].sum())
        parts += ["## Job times", "", f"{times.height} jobs, {total / 60:.1f} CPU-job minutes in all (jobs run "
                  "side by side, so the build's wall time is shorter).", "", _md(times.head(15)), ""]
    return "\n".join(parts)
