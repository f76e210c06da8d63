"""Train one arm of BLD on Spaced Retrieval (2 KDA + 2 attention layers, loss on the answer digits).

Resumable: loop checkpoints live in --work; rerunning after a kill continues the same run, while a
different run (any parameter or the data changed) starts over. The run itself is
`hybridlab.pipeline.jobs.train.train_bld_sr` (what it writes: see its docstring; below: the --params keys).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import BldSrJob
    from hybridlab.pipeline.jobs import train as jobs

    p = _common.parser(__doc__, BldSrJob)
    p.add_argument("--data", required=True, help="spaced_retrieval split directory (train/val/test.parquet)")
    p.add_argument("--work", required=True, help="run directory (loop checkpoints, score checkpoints)")
    p.add_argument("--out", required=True, help="arm output directory")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    jobs.train_bld_sr(_common.load_job(BldSrJob, args.params), data=args.data, work=args.work, out=args.out,
                      restart=args.restart, threads=args.threads)


if __name__ == "__main__":
    _common.run(main)
