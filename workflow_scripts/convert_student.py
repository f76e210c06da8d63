"""Convert a dense teacher into a hybrid: full attention at the placement's layers, a mixer elsewhere.

The student inherits q/k/v/o from the teacher's attention (GQA k/v heads repeated); new mixer
parameters are initialised as fla does, seeded; the loaded teacher is converted in place (one model in
memory); `conv_init` ("identity", the default, or
"random") chooses the q/k/v short convolutions' kernel (hybridlab.models.convert). Written with
`save_hybrid` (config.json of the base model + model.safetensors + hybrid.json), loadable with
`hybridlab.models.io.load_hybrid`. A searched placement (`searched`, `searched_<group>`) keeps the FA layers
with the highest importance of its language group in `--importance` (eval_layer_importance.py) and records
the scores in hybrid.json; `all_mixers` converts every layer (the importance pass's student).
"""

import _common


def main() -> None:
    from hybridlab.config_spec import ConvertJob

    p = _common.parser(__doc__, ConvertJob)
    p.add_argument("--teacher", required=True, help="teacher model directory (from_pretrained layout)")
    p.add_argument("--out", required=True, help="student directory")
    p.add_argument("--importance", help="a searched placement: the layer importance table (.parquet)")
    args = p.parse_args()
    job = _common.load_job(ConvertJob, args.params)

    from hybridlab.pipeline.jobs.models import convert_student_job

    print(convert_student_job(job, teacher=args.teacher, out=args.out, importance=args.importance))


if __name__ == "__main__":
    _common.run(main)
