"""A placement's stage-1 student assembled from the shared stage 1 (every layer converted, teacher inputs).

Its mixers are the shared run's, its full-attention layers the teacher's; two held-out evaluations (converted,
assembled) give its stage-1 curve. The job is `hybridlab.pipeline.jobs.distill.assemble_stage1` (what it writes: see its
docstring; below: the --params keys, stage 2's settings).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import DistillStage2Job, describe_job
    from hybridlab.pipeline.jobs import distill as distill_jobs

    p = _common.parser(__doc__, describe_job(DistillStage2Job))
    p.add_argument("--teacher", required=True, help="teacher model directory or hub id")
    p.add_argument("--student", required=True, help="the placement's converted hybrid directory")
    p.add_argument("--shared", required=True, help="the shared stage-1 result (every layer converted)")
    p.add_argument("--mixture", required=True, help="packed multilingual mixture directory")
    p.add_argument("--out", required=True, help="output hybrid directory")
    args = p.parse_args()
    distill_jobs.assemble_stage1(_common.load_job(DistillStage2Job, args.params), teacher=args.teacher,
                         student=args.student, shared=args.shared, mixture=args.mixture, out=args.out)


if __name__ == "__main__":
    _common.run(main)
