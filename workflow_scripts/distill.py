"""Distil a dense teacher into its converted hybrid: stage 1 (attention alignment) or stage 2 (logit KL).

Resumable: rerunning the same command after a kill continues from the last checkpoint in --work
(`--restart` starts over). The run itself is `hybridlab.pipeline.jobs.distill.distill` (what it writes: see its
docstring; below: the --params keys of each stage).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import DISTILL_JOBS, describe_job
    from hybridlab.pipeline.jobs import distill as distill_jobs

    p = _common.parser(__doc__, "\n\n".join(describe_job(cls) for cls in DISTILL_JOBS.values()))
    p.add_argument("--stage", required=True, type=int, choices=(1, 2), help="distillation stage")
    p.add_argument("--teacher", required=True, help="teacher model directory or hub id")
    p.add_argument("--student", required=True, help="student hybrid directory (converted, or stage-1 output)")
    p.add_argument("--mixture", required=True, help="packed multilingual mixture directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="output hybrid directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    distill_jobs.distill(_common.load_job(DISTILL_JOBS[args.stage], args.params), stage=args.stage, teacher=args.teacher, student=args.student,
                 mixture=args.mixture, work=args.work, out=args.out, restart=args.restart)


if __name__ == "__main__":
    _common.run(main)
