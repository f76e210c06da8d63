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

    from hybridlab.pipeline.jobs.eval import gather_job

    gather_job(args.kind, _common.load_job(GatherJob, args.params), inputs=args.inputs, out=args.out,
               examples=args.examples)


if __name__ == "__main__":
    _common.run(main)
