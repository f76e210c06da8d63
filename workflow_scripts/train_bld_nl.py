"""Train one BLD natural-language arm: a NoPE Attention-Mixer-Mixer-Mixer hybrid on English text.

Resumable: rerunning the same command after a kill continues from the last checkpoint in --work
(`--restart` starts over). The run itself is `hybridlab.pipeline.jobs.train.train_bld_nl` (what it writes:
see its docstring; below: the --params keys; the model, arms and schedule are `hybridlab.train.bld_nl`).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import BldNlJob
    from hybridlab.pipeline.jobs import train as jobs

    p = _common.parser(__doc__, BldNlJob)
    p.add_argument("--mixture", required=True, help="packed English mixture directory")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="final model directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    jobs.train_bld_nl(_common.load_job(BldNlJob, args.params), mixture=args.mixture, tokenizer=args.tokenizer,
                      work=args.work, out=args.out, restart=args.restart, threads=args.threads)


if __name__ == "__main__":
    _common.run(main)
