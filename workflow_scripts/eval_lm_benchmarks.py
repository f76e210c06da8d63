"""Standard benchmarks (lm-eval, paper preset) on the models given (the rule runs one model per job).

Each model directory is loaded with `hybridlab.models.registry.load_causal_lm` (plain transformers
directories and `save_hybrid` hybrids alike) and handed, already loaded, to lm-eval's HFLM wrapper
(`hybridlab.eval.lm_eval`). Without lm-eval, or offline, the run stops with one line. Writes --out
(lm_benchmarks.parquet): model, task, metric, filter, value, stderr, plus the RULER and recall means
(task "ruler" / "recall", see `hybridlab.eval.lm_eval`). With --work, each finished lm-eval call is kept
and a rerun skips it (`hybridlab.pipeline.jobs.eval.lm_benchmarks_job`).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import LmBenchmarksJob

    p = _common.parser(__doc__, LmBenchmarksJob)
    p.add_argument("--models", nargs="+", required=True, help="model directories")
    p.add_argument("--tokenizer", nargs="+", required=True,
                   help="each model's tokenizer directory or hub id, in --models order (or one for all); RULER "
                        "builds inputs with it")
    p.add_argument("--out", required=True, help="results table (parquet)")
    p.add_argument("--work", help="resume directory: each model's finished lm-eval calls are kept under it (a "
                                  "rerun evaluates only the rest)")
    args = p.parse_args()
    job = _common.load_job(LmBenchmarksJob, args.params)

    from hybridlab.pipeline.jobs.eval import lm_benchmarks_job

    lm_benchmarks_job(job, models=args.models, tokenizers=args.tokenizer, out=args.out, work=args.work)


if __name__ == "__main__":
    _common.run(main)
