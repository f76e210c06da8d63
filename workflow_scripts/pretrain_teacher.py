"""Pre-train the dense teacher (Qwen3 architecture from a local config) on the multilingual mixture.

Resumable: rerunning the same command after a kill continues from the last checkpoint in --work.
The run itself is `hybridlab.pipeline.jobs.train.pretrain_teacher` (what it writes: see its docstring; below: the
--params keys).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import TeacherJob
    from hybridlab.pipeline.jobs import train as jobs

    p = _common.parser(__doc__, TeacherJob)
    p.add_argument("--mixture", required=True, help="packed mixture directory")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="final model directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    jobs.pretrain_teacher(_common.load_job(TeacherJob, args.params), mixture=args.mixture, tokenizer=args.tokenizer,
                          work=args.work, out=args.out, restart=args.restart)


if __name__ == "__main__":
    _common.run(main)
