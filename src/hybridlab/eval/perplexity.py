"""Next-token NLL and KL(teacher || student) from full logits: the reference definitions.

- `token_nll(logits, ids)`: -log p(x_t | x_<t) for t = 1..T-1, float32, `[B, T-1]`.
- `token_kl(teacher_logits, student_logits)`: KL(teacher || student) of the next-token distributions at
  the same positions, sum_v p_T(v) (log p_T(v) - log p_S(v)), the stage-2 distillation objective's direction.

Held-out CE / perplexity / KL tables without full logits, and tokens-to-target-loss, are
`hybridlab.train.heldout` (training evaluates its curves with them).
"""

from __future__ import annotations

import polars as pl
import torch
import torch.nn.functional as F

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError
from hybridlab.train.heldout import evaluate_perplexity


def token_nll(logits_BTV: torch.Tensor, input_ids_BT: torch.Tensor) -> torch.Tensor:
    """-log p(x_t | x_<t) for t = 1..T-1, float32; [B, T-1]."""
    if logits_BTV.shape[:2] != input_ids_BT.shape:
        raise HybridlabError(f"logits {tuple(logits_BTV.shape)} do not match input ids {tuple(input_ids_BT.shape)}")
    logp_BTV = F.log_softmax(logits_BTV[:, :-1].float(), dim=-1)
    return -logp_BTV.gather(-1, input_ids_BT[:, 1:, None]).squeeze(-1)


def token_kl(teacher_logits_BTV: torch.Tensor, student_logits_BTV: torch.Tensor) -> torch.Tensor:
    """KL(teacher || student) of the next-token distributions at positions 0..T-2 (same as token_nll); [B, T-1]."""
    if teacher_logits_BTV.shape != student_logits_BTV.shape:
        raise HybridlabError(f"teacher logits {tuple(teacher_logits_BTV.shape)} and student logits "
                             f"{tuple(student_logits_BTV.shape)} differ; KL needs the same tokenizer and vocab size")
    logp_t = F.log_softmax(teacher_logits_BTV[:, :-1].float(), dim=-1)
    logp_s = F.log_softmax(student_logits_BTV[:, :-1].float(), dim=-1)
    return (logp_t.exp() * (logp_t - logp_s)).sum(-1)


# --- the perplexity tables of the eval_perplexity rule ---------------------------------------------------

PERPLEXITY_COLUMNS = ["model", "teacher", "placement", "mixer", "seed", "lang", "n_tokens", "ce", "ppl", "kl"]
TOKENS_COLUMNS = ["teacher", "mixer", "seed", "placement", "metric", "lang", "target", "tokens", "baseline_tokens",
                  "fraction", "final"]
ROWS_COLUMNS = ["model", "teacher", "placement", "mixer", "seed", "lang", "row", "n_tokens", "ce", "kl"]
_PER_ROW_SCHEMA = {"row": pl.Int64, "lang": pl.String, "n_tokens": pl.Int64, "ce": pl.Float64, "kl": pl.Float64}


def perplexity_tables(mixture: str, params: "PerplexityJob | dict", *, device: str | torch.device | None = None, log=print
                      ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """(perplexity, tokens_to_baseline, per_row) tables of every teacher and its stage-2 students (the
    eval_perplexity rule; workflow_scripts/eval_perplexity.py).

    `params`: the job's section (`hybridlab.config_spec.PerplexityJob`, or its dict). `mixture`: the packed
    multilingual mixture directory; its `mixtures` ({teacher: directory}) override it per teacher (a teacher
    and its students read the mixture of the teacher's own tokenizer).

    - perplexity: one row per model x language of CE / perplexity / KL-to-teacher (`evaluate_perplexity`)
      on the first `rows_per_language` held-out rows of each language, plus a lang="all" row per model
      pooled over every token (`train.distill.with_overall`), in the columns PERPLEXITY_COLUMNS; teacher
      rows have null placement, mixer, seed and kl; teachers in name order, each followed by its students.
    - tokens_to_baseline: per teacher x mixer x seed, the stage-2 held-out curves (`metrics.parquet` of
      each student directory) of every placement against the same seed's baseline placement's final
      value (`train.distill.tokens_to_baseline`), for ce and kl, pooled and per language (TOKENS_COLUMNS).
    - per_row: one row per model x held-out row with the row's token-mean ce and kl (ROWS_COLUMNS); every
      model of one teacher is scored on the same rows, so placements and seeds are paired on `row`.
    """
    from pathlib import Path

    from hybridlab.data.packed_dataset import PackedDataset
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train import distill

    from hybridlab.config_spec import PerplexityJob, job_settings, to_dict
    from hybridlab.device import fast_dtype

    job = job_settings(PerplexityJob, params, "eval_perplexity.py")
    device = resolve_device(device)
    _dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16}
    dtype = _dtypes[fast_dtype(job.dtype, device.type)] if job.dtype else (
        torch.bfloat16 if device.type == "cuda" else torch.float32)
    tables, token_tables, row_tables = [], [], []

    def run(model, ids, langs, name, teacher_model=None, memo=None, **cols):
        per_row = []
        table = evaluate_perplexity(model, ids, langs, model_name=name, teacher=teacher_model,
                                    batch_size=job.batch_size, device=device, per_row=per_row,
                                    teacher_memo=memo)
        row_tables.append(pl.DataFrame(per_row, schema=_PER_ROW_SCHEMA)
                          .with_columns(model=pl.lit(name), **{k: pl.lit(v) for k, v in cols.items()}))
        return distill.with_overall(table)

    for teacher_name, teacher_path in sorted(job.teachers.items()):
        teacher_mixture = job.mixtures.get(teacher_name, mixture)
        ids, langs = distill.heldout_rows(PackedDataset(teacher_mixture, "val"), job.rows_per_language)
        log(f"{teacher_name}: {ids.shape[0]} held-out rows of {ids.shape[1]} tokens in {len(set(langs))} "
            f"languages of {teacher_mixture}")
        teacher = distill.freeze(load_causal_lm(teacher_path, dtype=dtype)).to(device)
        t = run(teacher, ids, langs, teacher_name, teacher=teacher_name, placement=None, mixer=None, seed=None)
        tables.append(t.with_columns(teacher=pl.lit(teacher_name), placement=pl.lit(None, pl.String),
                                     mixer=pl.lit(None, pl.String), seed=pl.lit(None, pl.Int64)))
        log(f"{teacher_name}: held-out CE {t['ce'][-1]:.4f}")
        students = [to_dict(s) for s in job.students if s.teacher == teacher_name]
        memo: dict = {}  # the teacher's hidden states on these rows, shared by all its students
        for s in students:
            seed = s.get("seed")
            student = load_causal_lm(s["dir"], dtype=dtype).to(device)
            table = run(student, ids, langs, f"{teacher_name}/{s['placement']}-{s['mixer']}", teacher, memo,
                        teacher=teacher_name, placement=s["placement"], mixer=s["mixer"], seed=seed)
            tables.append(table.with_columns(teacher=pl.lit(teacher_name), placement=pl.lit(s["placement"]),
                                             mixer=pl.lit(s["mixer"]), seed=pl.lit(seed, pl.Int64)))
            log(f"  {s['placement']}-{s['mixer']} seed {seed}: CE {table['ce'][-1]:.4f}  KL {table['kl'][-1]:.4f}")
            del student
        for mixer, seed in sorted({(s["mixer"], s.get("seed")) for s in students}, key=str):
            curves = {s["placement"]: pl.read_parquet(Path(s["dir"]) / "metrics.parquet")
                      for s in students if s["mixer"] == mixer and s.get("seed") == seed}
            tb = distill.tokens_to_baseline(curves, job.baseline_placement)
            token_tables.append(tb.with_columns(teacher=pl.lit(teacher_name), mixer=pl.lit(mixer),
                                                seed=pl.lit(seed, pl.Int64)))
        del teacher
    if not tables:
        raise HybridlabError("no teacher to evaluate; --params teachers is empty")

    ppl = pl.concat(tables).select(PERPLEXITY_COLUMNS)
    tokens = pl.concat(token_tables).select(TOKENS_COLUMNS)
    rows = pl.concat(row_tables, how="diagonal_relaxed").with_columns(
        pl.col("seed").cast(pl.Int64), pl.col("placement").cast(pl.String), pl.col("mixer").cast(pl.String)
    ).select(ROWS_COLUMNS)
    for row in tokens.filter(pl.col("lang") == distill.ALL_LANGS).iter_rows(named=True):
        log(f"{row['teacher']} {row['mixer']} seed {row['seed']} {row['placement']:>22} {row['metric']}: "
            f"fraction of baseline tokens {row['fraction']}")
    return ppl, tokens, rows
