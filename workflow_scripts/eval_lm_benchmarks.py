"""Standard benchmarks (lm-eval, paper preset) on the models given (the rule runs one model per job).

Each model directory is loaded with `hybridlab.models.registry.load_causal_lm` (plain transformers
directories and `save_hybrid` hybrids alike) and handed, already loaded, to lm-eval's HFLM wrapper
(`hybridlab.eval.lm_eval`). Without lm-eval, or offline, the run stops with one line. Writes --out
(lm_benchmarks.parquet): model, task, metric, filter, value, stderr, plus the RULER and recall means
(task "ruler" / "recall", see `hybridlab.eval.lm_eval`). With --work, each finished lm-eval call is kept
and a rerun skips it.
"""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import LmBenchmarksJob, to_dict

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

    import polars as pl

    from hybridlab.atomic import atomic_file
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.errors import HybridlabError
    from hybridlab.eval.lm_eval import RULER_TASKS, LMEvalConfig, require_lm_eval, run_lm_eval
    from hybridlab.models.registry import load_causal_lm

    require_lm_eval()  # fail before loading any model
    c = job.lm_eval
    cfg = LMEvalConfig(tasks=c.tasks, ruler_lengths=c.ruler_lengths, ruler_tasks=c.ruler_tasks or RULER_TASKS,
                       ruler_exclude=c.ruler_exclude, num_fewshot=c.num_fewshot, batch_size=c.batch_size,
                       limit=c.limit, max_length=c.max_length, seed=job.seed, ruler_samples=c.ruler_samples or None)
    if len(args.tokenizer) not in (1, len(args.models)):
        raise HybridlabError(f"--tokenizer: {len(args.tokenizer)} tokenizers for {len(args.models)} models; give one "
                             "per model (same order) or one for all")
    tok_paths = args.tokenizer * len(args.models) if len(args.tokenizer) == 1 else args.tokenizer
    tables = []
    for model_dir, tok_path in zip(args.models, tok_paths):
        # results/<phase>/<scale>/<what> -> <what> (e.g. distill/<teacher>/<student>/stage2: unique per teacher)
        parts = Path(model_dir).parts
        name = "/".join(parts[3:] if parts[0] == "results" and len(parts) > 3 else parts[-2:])
        tok = load_tokenizer(tok_path)  # the evaluated model's own tokenizer
        work = None
        if args.work:  # keyed by the settings and the model's weights: other ones start over
            from hybridlab.train.run import work_dir

            weights = [f for f in (Path(model_dir) / "model.safetensors",) if f.exists()]
            work = work_dir(Path(args.work) / name.replace("/", "--"),
                            {"params": to_dict(job), "model": name, "tokenizer": tok_path}, weights)
        model = load_causal_lm(model_dir, dtype=c.dtype, device_map=c.device)
        tables.append(run_lm_eval(model, tok, cfg, tokenizer_name=tok_path, model_name=name, work=work))
        del model
    with atomic_file(args.out) as tmp:
        pl.concat(tables).write_parquet(tmp)


if __name__ == "__main__":
    _common.run(main)
