"""Gather the per-model tables of one evaluation into the table(s) the figures read.

`softcka`: the eval_softcka_model jobs' tables of one replicate seed -> --out (softcka.parquet or
softcka_seed<N>.parquet; `hybridlab.eval.softcka.gather_softcka`). `niah`: the eval_niah jobs' per-example
tables -> --examples (niah_examples.parquet, every model) and --out (niah.parquet, the summary;
`hybridlab.eval.niah.gather_niah`). `lm_benchmarks`: the eval_lm_benchmarks jobs' tables -> --out
(lm_benchmarks.parquet; `hybridlab.eval.lm_eval.gather_tables`). `layer_importance`: the scores of every teacher x
mixer (eval_layer_importance.py) -> --out (layer_importance.parquet), one after another. Same columns as a single job over every
model wrote.
"""

import _common

def main() -> None:
    from hybridlab.config_spec import GatherJob

    p = _common.parser(__doc__, GatherJob)
    p.add_argument("kind", choices=["softcka", "niah", "lm_benchmarks", "layer_importance"])
    p.add_argument("--inputs", nargs="+", required=True, help="per-model tables (.parquet)")
    p.add_argument("--out", required=True, help="the gathered table (niah: the summary)")
    p.add_argument("--examples", help="niah: the per-example table of every model")
    args = p.parse_args()
    job = _common.load_job(GatherJob, args.params)

    from hybridlab.errors import HybridlabError
    from hybridlab.eval.pairs import write_table

    if args.kind == "softcka":
        from hybridlab.eval.softcka import gather_softcka

        write_table(gather_softcka(args.inputs, pairs=job.pairs or None), args.out)
        return
    if args.kind == "layer_importance":
        import polars as pl

        write_table(pl.concat([pl.read_parquet(p) for p in args.inputs]), args.out)
        return
    if args.kind == "lm_benchmarks":
        from hybridlab.eval.lm_eval import gather_tables

        write_table(gather_tables(args.inputs), args.out)
        return
    if not args.examples:
        raise HybridlabError("gather_eval.py niah: give --examples (the per-example table)")
    from hybridlab.eval.niah import gather_niah

    examples, summary = gather_niah(args.inputs)
    write_table(examples, args.examples)
    write_table(summary, args.out)


if __name__ == "__main__":
    _common.run(main)
