"""Per-language CE / perplexity / KL-to-teacher of every teacher and stage-2 student, and tokens to baseline.

Table 1 (--out, tidy): model, teacher, placement, mixer, seed, lang, n_tokens, ce, ppl, kl on the first
`rows_per_language` held-out rows of each language of the packed mixture (`eval.perplexity`), plus a
lang="all" row per model pooled over every token. Teacher rows have null placement, mixer, seed and kl;
`seed` is the student's replicate seed (experiments.distill.seeds).
Table 2 (--tokens-out): per teacher x mixer x seed, the stage-2 held-out curves of every placement against
the same seed's baseline placement's final value (`hybridlab.train.distill.tokens_to_baseline`), for ce
and kl, pooled and per language; columns teacher, mixer, seed, placement, metric, lang, target, tokens,
baseline_tokens, fraction, final.
Table 3 (--rows-out, optional): one row per model x held-out row: model, teacher, placement, mixer, seed,
lang, row, n_tokens, ce, kl (the row's token means). Every model of one teacher is scored on the same
rows, so placements and seeds are paired on `row` (the unit of the tables' bootstrap CIs and tests).
"""

import os
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mixture", required=True,
                   help="packed multilingual mixture directory (params.mixtures overrides it per teacher)")
    p.add_argument("--out", required=True, help="perplexity table (parquet)")
    p.add_argument("--tokens-out", required=True, help="tokens-to-baseline table (parquet)")
    p.add_argument("--rows-out", help="per-row CE / KL table (parquet)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl
    import torch

    from hybridlab.data.packing import PackedDataset
    from hybridlab.errors import HybridlabError
    from hybridlab.eval.perplexity import evaluate_perplexity
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train import distill

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32

    def heldout(teacher_name):
        # A teacher and its students read the mixture of the teacher's own tokenizer.
        mixture = params.get("mixtures", {}).get(teacher_name, args.mixture)
        ids, langs = distill.heldout_rows(PackedDataset(mixture, "val"), params["rows_per_language"])
        print(f"{teacher_name}: {ids.shape[0]} held-out rows of {ids.shape[1]} tokens in {len(set(langs))} "
              f"languages of {mixture}")
        return ids, langs

    def run(model, name, teacher_model=None, **cols):
        per_row = []
        table = evaluate_perplexity(model, ids, langs, model_name=name, teacher=teacher_model,
                                    batch_size=params["batch_size"], device=device, per_row=per_row)
        row_tables.append(pl.DataFrame(per_row, schema={"row": pl.Int64, "lang": pl.String, "n_tokens": pl.Int64,
                                                        "ce": pl.Float64, "kl": pl.Float64})
                          .with_columns(model=pl.lit(name), **{k: pl.lit(v) for k, v in cols.items()}))
        return distill.with_overall(table)

    tables, token_tables, row_tables = [], [], []
    for teacher_name, teacher_path in sorted(params["teachers"].items()):
        ids, langs = heldout(teacher_name)
        teacher = distill.freeze(load_causal_lm(teacher_path, dtype=dtype)).to(device)
        t = run(teacher, teacher_name, teacher=teacher_name, placement=None, mixer=None, seed=None)
        tables.append(t.with_columns(teacher=pl.lit(teacher_name), placement=pl.lit(None, pl.String),
                                     mixer=pl.lit(None, pl.String), seed=pl.lit(None, pl.Int64)))
        print(f"{teacher_name}: held-out CE {t['ce'][-1]:.4f}")
        students = [s for s in params["students"] if s["teacher"] == teacher_name]
        for s in students:
            seed = s.get("seed")
            student = load_causal_lm(s["dir"], dtype=dtype).to(device)
            table = run(student, f"{teacher_name}/{s['placement']}-{s['mixer']}", teacher, teacher=teacher_name,
                        placement=s["placement"], mixer=s["mixer"], seed=seed)
            tables.append(table.with_columns(teacher=pl.lit(teacher_name), placement=pl.lit(s["placement"]),
                                             mixer=pl.lit(s["mixer"]), seed=pl.lit(seed, pl.Int64)))
            print(f"  {s['placement']}-{s['mixer']} seed {seed}: CE {table['ce'][-1]:.4f}  KL {table['kl'][-1]:.4f}")
            del student
        for mixer, seed in sorted({(s["mixer"], s.get("seed")) for s in students}, key=str):
            curves = {s["placement"]: pl.read_parquet(Path(s["dir"]) / "metrics.parquet")
                      for s in students if s["mixer"] == mixer and s.get("seed") == seed}
            tb = distill.tokens_to_baseline(curves, params["baseline_placement"])
            token_tables.append(tb.with_columns(teacher=pl.lit(teacher_name), mixer=pl.lit(mixer),
                                                seed=pl.lit(seed, pl.Int64)))
        del teacher
    if not tables:
        raise HybridlabError("no teacher to evaluate; params.teachers is empty")

    columns = ["model", "teacher", "placement", "mixer", "seed", "lang", "n_tokens", "ce", "ppl", "kl"]
    ppl = pl.concat(tables).select(columns)
    tokens = pl.concat(token_tables).select(["teacher", "mixer", "seed", "placement", "metric", "lang", "target",
                                             "tokens", "baseline_tokens", "fraction", "final"])
    rows = pl.concat(row_tables, how="diagonal_relaxed").with_columns(
        pl.col("seed").cast(pl.Int64), pl.col("placement").cast(pl.String), pl.col("mixer").cast(pl.String)).select(
        ["model", "teacher", "placement", "mixer", "seed", "lang", "row", "n_tokens", "ce", "kl"])
    outputs = [(ppl, args.out), (tokens, args.tokens_out)] + ([(rows, args.rows_out)] if args.rows_out else [])
    for frame, path in outputs:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = f"{path}.tmp"
        frame.write_parquet(tmp)
        os.replace(tmp, path)
    overall = tokens.filter((pl.col("lang") == distill.ALL_LANGS))
    for row in overall.iter_rows(named=True):
        print(f"{row['teacher']} {row['mixer']} seed {row['seed']} {row['placement']:>22} {row['metric']}: "
              f"fraction of baseline tokens {row['fraction']}")


if __name__ == "__main__":
    _common.run(main)
