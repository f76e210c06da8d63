"""A GGUF teacher: convert the file once into a from_pretrained model directory (weights, config, tokenizer
with its chat template, gguf.json with the file's sha256) that every later job reads
(`hybridlab.models.gguf.convert_gguf`)."""

import json

import _common


def main() -> None:
    from hybridlab.config_spec import TeacherJob

    p = _common.parser(__doc__, TeacherJob)
    for name in ("--mixture", "--tokenizer", "--work"):
        p.add_argument(name, help="unused for GGUF teachers (accepted so every teacher script shares a rule)")
    p.add_argument("--out", required=True, help="the model directory")
    args = p.parse_args()

    job = _common.load_job(TeacherJob, args.params)

    from hybridlab.pipeline.jobs.models import gguf_teacher_job

    record = gguf_teacher_job(job, out=args.out)
    print(f"converted {job.name} from {record['file']} -> {args.out}: {json.dumps(record, sort_keys=True)}")


if __name__ == "__main__":
    _common.run(main)
