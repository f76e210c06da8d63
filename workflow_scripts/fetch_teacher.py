"""Paper preset: load a hub teacher (or a local path) and save it as a local from_pretrained directory.

Later rules read the local copy, so the hub is touched once per teacher. A missing or gated model
fails with one line naming the model and the fix (HF_TOKEN, `huggingface-cli login`, a local path).
"""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import TeacherJob

    p = _common.parser(__doc__, TeacherJob)
    for name in ("--mixture", "--tokenizer", "--work"):
        p.add_argument(name, help="unused for hub teachers (accepted so both teacher scripts share a rule)")
    p.add_argument("--out", required=True, help="local model directory")
    args = p.parse_args()

    job = _common.load_job(TeacherJob, args.params)

    from hybridlab.pipeline.jobs.models import fetch_teacher_job

    fetch_teacher_job(job, out=args.out)
    print(f"saved {job.name} to {Path(args.out)}")


if __name__ == "__main__":
    _common.run(main)
